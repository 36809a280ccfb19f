"""TrainingState.sync between two real Horovod (Gloo) processes: a trained rank 0, a new rank 1."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from testbed import VENV_BIN, Job, child_env

HERE = Path(__file__).parent

pytestmark = pytest.mark.slow


def test_sync_makes_a_new_rank_identical_without_moving_its_parameters(tmp_path):
    cmd = [VENV_BIN / "horovodrun", "--gloo", "-np", "2", "-H", "localhost:2", sys.executable, HERE / "sync_worker.py"]
    # finish() fails on any exit but 0 (with the log tail); the workers die with the job on a hang.
    with Job(cmd, env=child_env(OUT=str(tmp_path)), logdir=tmp_path, name="horovodrun") as job:
        job.start().finish(timeout=300)
    r0, r1 = (json.loads((tmp_path / f"sync-{r}.json").read_text()) for r in (0, 1))
    for key in ("params", "buffers", "optimizer", "optimizer_keys", "lr", "scheduler", "sampler", "values", "rng"):
        assert r0[key] == r1[key], f"{key} differs after sync"
    # rank 1 had no optimizer state; it now has Adam's, created from rank 0's bytes
    assert r1["optimizer_keys"][0] == ["exp_avg", "exp_avg_sq", "step"]
    assert r1["moment_devices_shared"]
    # restore() after the sync came back to the synced state on both ranks
    assert r0["params"] == r0["params_after_sync"] == r1["params_after_sync"]
    assert r0["values"] == {"epoch": 2, "best": {"loss": 0.25, "at": [2, 7]}}
    assert r0["sampler"]["offset"] == 30 and r1["changed_by_sync"] and not r0["changed_by_sync"]
    assert r0["buckets"] > 2  # small buckets: the pipelined path with several dtypes ran
