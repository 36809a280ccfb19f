"""Each rank has its own RNG streams after a sync, derived from the committed state and the rank.

Before (issue 11): ``rng=True`` gave every rank rank 0's streams after each
sync, so dropout masks and augmentations were identical on all ranks; this
test's first assertion failed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from testbed import VENV_BIN, Job, child_env

HERE = Path(__file__).parent

pytestmark = pytest.mark.slow


def test_ranks_draw_their_own_streams_deterministically_after_a_sync(tmp_path):
    cmd = [VENV_BIN / "horovodrun", "--gloo", "-np", "2", "-H", "localhost:2", sys.executable,
           HERE / "rank_streams_worker.py"]
    with Job(cmd, env=child_env(OUT=str(tmp_path)), logdir=tmp_path, name="horovodrun") as job:
        job.start().finish(timeout=300)
    r0, r1 = (json.loads((tmp_path / f"streams-{r}.json").read_text()) for r in (0, 1))
    for i, generator in enumerate(("torch", "python", "numpy")):
        assert r0["first"][i] != r1["first"][i], f"ranks draw the same {generator} stream after a sync"
    # restore() and a second sync from the same committed state give the same streams again
    assert r0["again"] == r0["first"] and r1["again"] == r1["first"]
