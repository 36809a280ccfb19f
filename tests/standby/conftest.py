"""A real ``hvd-elastic standby`` process per test (:class:`testbed.standby.StandbyProcess`)."""

from __future__ import annotations

import pytest

from testbed.standby import StandbyProcess


@pytest.fixture
def standby(tmp_path):
    """A ready standby named ``t``; stopped (and reaped) after the test, also on failure."""
    with StandbyProcess(tmp_path) as process:
        process.wait_ready()
        yield process
