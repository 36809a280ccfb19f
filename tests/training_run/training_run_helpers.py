"""Helpers shared by the training_run tests (a uniquely named module, since every
test area has its own conftest.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).parent
REPO = HERE.parent.parent
BIN = Path(sys.executable).parent


def subprocess_env(**extra: str) -> dict[str, str]:
    """The test's environment with the venv first on PATH and this checkout importable."""
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env
