"""hvd_elastic/errors.py: every error that reaches a caller derives from HvdElasticError.

The package's exception classes are found by reading its sources (a new one cannot be forgotten here),
then imported and checked; the only ones exempt are those used for control flow inside a module.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import hvd_elastic
from hvd_elastic.errors import HvdElasticError

PACKAGE = Path(hvd_elastic.__file__).parent

# Raised and caught inside one module (or answered as an HTTP status by the dev agent), never seen by a caller;
# JoinInterrupt is a HostsUpdatedInterrupt that Horovod's own loop catches.
CONTROL_FLOW = {
    "consul.transport.InvalidHeader", "consul.transport.BadAnswer", "devagent.httpserver._BadRequest",
    "devagent.errors.HTTPError", "devagent.bexpr.FilterError", "devagent.checks.StatusError",
    "devagent.decode.DecodeError", "discovery.cache.CacheInvalid", "nodeagent.loop.Refused",
    "commands.exec.Fallback", "training.checkpoint._Invalid", "training._internal.join_ahead.JoinInterrupt",
}


def exception_classes() -> list[tuple[str, str]]:
    """(module, class) for every class in the package whose bases name an exception."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    ast.unparse(b).endswith(("Error", "Exception", "Interrupt")) for b in node.bases):
                found.append((module, node.name))
    return found


def test_the_sources_hold_the_exception_classes_this_test_knows():
    names = {f"{m}.{c}" for m, c in exception_classes()}
    assert len(names) > 20 and "consul.errors.ConsulError" in names
    assert CONTROL_FLOW <= names, f"listed as control flow but gone: {sorted(CONTROL_FLOW - names)}"


@pytest.mark.parametrize("module,name", exception_classes(), ids=lambda v: v)
def test_every_error_derives_from_the_root_and_control_flow_does_not(module, name):
    cls = getattr(importlib.import_module(f"hvd_elastic.{module}"), name)
    assert issubclass(cls, Exception)
    if f"{module}.{name}" in CONTROL_FLOW:
        assert not issubclass(cls, HvdElasticError), f"{name} is listed as control flow but is an error"
    else:
        assert issubclass(cls, HvdElasticError), f"hvd_elastic.{module}.{name} does not derive from HvdElasticError"
