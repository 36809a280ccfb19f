"""Slurm tests need the netns bed and Slurm's daemons: skipped with the reason otherwise (a failure in CI, see
tests/conftest.py)."""

from __future__ import annotations

import pytest

from testbed import netns, slurm

_REASON = netns.unavailable_reason() or slurm.unavailable_reason()


def pytest_collection_modifyitems(items):
    for item in items:
        if _REASON and item.get_closest_marker("multihost"):
            item.add_marker(pytest.mark.skip(reason=_REASON))
