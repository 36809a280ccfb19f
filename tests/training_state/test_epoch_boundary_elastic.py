"""A reset and a whole-job restart that land exactly on an epoch's last commit, under elastic horovodrun.

The test-bed worker (:mod:`hvd_elastic.testbed.worker`, DataLoader with a worker
process) holds every rank after the last commit of an epoch while
``hold-epoch-<E>`` exists; the fault is injected during that hold, so it lands
on the boundary by construction, not by luck of timing.  On the code before the
fix, the re-entered pass over the exhausted epoch raised in every rank and the
job was lost.  Each run must finish with every sample exactly once per epoch and
identical parameters on every rank (:func:`hvd_elastic.testbed.ledger.verdict`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from hvd_elastic.testbed import Job, child_env, horovodrun_elastic, host_file_discovery
from hvd_elastic.testbed.ledger import verdict
from hvd_elastic.training.checkpoint import CheckpointManager
from hvd_elastic.training.events import EventLog

pytestmark = pytest.mark.slow

WAIT = 240.0  # hang guards, not speed bounds
EPOCHS = 3
SAMPLES = 96  # 12 steps an epoch at 2 ranks x 4


def boundary_job(out: Path, *worker_args: str) -> Job:
    discover = host_file_discovery(out / "hosts", "localhost:1\n127.0.0.1:1\n")
    cmd = [*horovodrun_elastic(discover, 2, 1, 2), sys.executable, "-m", "hvd_elastic.testbed.worker",
           "--out", out, "--samples", str(SAMPLES), "--epochs", str(EPOCHS), "--step-sleep", "0",
           "--num-workers", "1", *worker_args]
    return Job(cmd, logdir=out, name="horovodrun",
               env=child_env(discovery_state=out, HOROVOD_GLOO_TIMEOUT_SECONDS="30"))


def held(job: Job, out: Path, epoch: int) -> dict[int, dict]:
    """Wait until both ranks hold at the end of ``epoch``; {rank: {"step", "pid"}}."""
    paths = [out / f"held-epoch-{epoch}-{rank}" for rank in (0, 1)]
    job.wait_until(f"both ranks holding at the end of epoch {epoch}", lambda: all(p.exists() for p in paths), WAIT)
    return {rank: json.loads(p.read_text()) for rank, p in enumerate(paths)}


def assert_exactly_once(out: Path) -> None:
    result = verdict(out)
    assert result.problems() == [], result
    assert result.epochs == EPOCHS and result.samples == SAMPLES


def test_a_failure_on_an_epochs_last_commit_resumes_at_the_next_epoch(tmp_path):
    """A peer SIGKILLed while every rank holds after the last commit of epoch 0: the survivor's
    epoch-end collective fails, it restores that commit (epoch 0 exhausted), re-enters the loop
    and must pass over epoch 0 without a batch and go on to epoch 1."""
    (tmp_path / "hold-epoch-0").touch()
    with boundary_job(tmp_path) as job:
        job.start()
        holders = held(job, tmp_path, 0)
        victim = next(json.loads(p.read_text())["pid"] for p in (tmp_path / "pids").glob("*.json")
                      if json.loads(p.read_text())["host"] == "127.0.0.1")
        os.kill(victim, signal.SIGKILL)
        (tmp_path / "hold-epoch-0").unlink()
        job.finish(WAIT)
    assert_exactly_once(tmp_path)
    events = EventLog.read(tmp_path / "events.jsonl")
    restores = [e for e in events if e["event"] == "restore"]
    assert restores, "the survivor never restored: the fault did not land in the epoch-end collective"
    assert holders[0]["step"] == holders[1]["step"] == SAMPLES // 8
    assert "is exhausted" not in job.read_log()


def test_a_whole_job_restart_from_an_epochs_last_commit_resumes_at_the_next_epoch(tmp_path):
    """The newest checkpoint is the last commit of epoch 1 when the whole job is SIGKILLed: the
    relaunched job resumes there, passes over epoch 1 without a batch, and trains epoch 2."""
    (tmp_path / "hold-epoch-1").touch()
    ckpt = CheckpointManager(tmp_path / "ckpt")
    with boundary_job(tmp_path, "--checkpoint-every", "1") as job:
        job.start()
        step = held(job, tmp_path, 1)[0]["step"]

        def newest_step():
            manifests = ckpt.checkpoints()
            return manifests and json.loads(manifests[0].read_text())["step"]

        job.wait_until(f"the checkpoint of step {step} durable", lambda: newest_step() == step, WAIT)
        job.kill()
        (tmp_path / "hold-epoch-1").unlink()
        job.start().finish(WAIT)
    assert_exactly_once(tmp_path)
    resumes = [e for e in EventLog.read(tmp_path / "events.jsonl") if e["event"] == "resume"]
    assert [(r["step"], r["epoch"]) for r in resumes] == [(step, 1)], resumes
    assert "is exhausted" not in job.read_log()
