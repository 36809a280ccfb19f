"""The package's shape: every function fits on a screen.

A function longer than :data:`MOST_LINES` (its docstring included) is split
where it does two things; the sources are read, so a new one cannot slip by.
"""

from __future__ import annotations

import ast
from pathlib import Path

import hvd_elastic

PACKAGE = Path(hvd_elastic.__file__).parent
MOST_LINES = 60


def test_no_function_in_the_package_is_longer_than_a_screen():
    functions, long = 0, []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions += 1
                lines = node.end_lineno - node.lineno + 1
                if lines > MOST_LINES:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({lines} lines)")
    assert functions > 500, "the package's sources were not found"
    assert not long, "longer than a screen: " + "; ".join(long)
