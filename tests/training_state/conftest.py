"""Fixtures of the state-core tests (TrainingState, ExactlyOnceSampler, BatchPolicy)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def hvd():
    """Horovod initialised in this process as a world of one."""
    import horovod.torch as hvd

    hvd.init()
    yield hvd
