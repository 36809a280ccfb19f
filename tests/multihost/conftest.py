"""The multi-host fault matrix: skipped with the reason where the netns test bed cannot run (a failure in CI, see
tests/conftest.py)."""

from __future__ import annotations

import pytest

from testbed.netns import unavailable_reason

_REASON = unavailable_reason()
_ROWS: list[dict] = []


def pytest_collection_modifyitems(items):
    for item in items:
        if _REASON and item.get_closest_marker("multihost"):
            item.add_marker(pytest.mark.skip(reason=_REASON))


@pytest.fixture
def reliability():
    """Tests add one row per fault: the table is printed at the end of the session."""
    return _ROWS.append


def pytest_terminal_summary(terminalreporter):
    if not _ROWS:
        return
    write = terminalreporter.write_line
    write("")
    write("fault matrix (netns hosts over ssh): fault | injected | survived | lost | duplicated | params identical")
    for row in _ROWS:
        write(f"  {row['fault']:<44} {row['injected']:>3} {str(row['survived']):>8} {row['lost']:>5} "
              f"{row['duplicated']:>5} {str(row['identical']):>6}")
