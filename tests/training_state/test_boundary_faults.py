"""Faults that land exactly on a boundary, under elastic horovodrun on localhost + 127.0.0.1.

The test-bed worker (:mod:`testbed.worker`, DataLoader with a worker
process) is told where to be hit, so each fault lands on its boundary by
construction, not by luck of timing:

* an epoch's last commit: every rank holds there while ``hold-epoch-<E>`` exists.
  On the code before the fix, the re-entered pass over the exhausted epoch raised
  in every rank and the job was lost (issue 27);
* between ``optimizer.step()`` and ``commit()``: ``die-after-step`` makes rank 1
  SIGKILL itself after its update of step 20 (epoch 1), so rank 0 fails inside the step's loss
  allreduce with its own update applied; a restore must roll it back.  With the
  worker's ``--broken-restore`` the step is applied twice and the verdict must say so.

Each run must finish with every sample exactly once per epoch, identical state on
every rank, and the committed step chain intact (:func:`hvd_elastic.report.ledger.verdict`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from testbed import Job, child_env, horovodrun_elastic, host_file_discovery
from hvd_elastic.report.ledger import verdict
from hvd_elastic.training.checkpoint import CheckpointManager
from hvd_elastic.training.events import EventLog

pytestmark = pytest.mark.slow

WAIT = 240.0  # hang guards, not speed bounds
EPOCHS = 3
SAMPLES = 96
STEPS_PER_EPOCH = 12  # at 2 ranks x 4 samples


def boundary_job(out: Path, *worker_args: str) -> Job:
    discover = host_file_discovery(out / "hosts", "localhost:1\n127.0.0.1:1\n")
    cmd = [*horovodrun_elastic(discover, 2, 1, 2), sys.executable, "-m", "testbed.worker",
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
    """Rank 1 SIGKILLed while every rank holds after the last commit of epoch 0: the survivor's
    epoch-end collective fails, it restores that commit (epoch 0 exhausted), re-enters the loop
    and must pass over epoch 0 without a batch and go on to epoch 1."""
    (tmp_path / "hold-epoch-0").touch()
    with boundary_job(tmp_path) as job:
        job.start()
        holders = held(job, tmp_path, 0)
        os.kill(holders[1]["pid"], signal.SIGKILL)  # not rank 0: it writes the event log
        (tmp_path / "hold-epoch-0").unlink()
        job.finish(WAIT)
    assert_exactly_once(tmp_path)
    events = EventLog.read(tmp_path / "events.jsonl")
    restores = [e for e in events if e["event"] == "restore"]
    assert restores, "the survivor never restored: the fault did not land in the epoch-end collective"
    assert holders[0]["step"] == holders[1]["step"] == STEPS_PER_EPOCH
    assert "is exhausted" not in job.read_log()


def test_a_whole_job_restart_from_an_epochs_last_commit_resumes_at_the_next_epoch(tmp_path):
    """The newest checkpoint is the last commit of epoch 1 when the whole job is SIGKILLed: the
    relaunched job resumes there, passes over epoch 1 without a batch, and trains epoch 2."""
    (tmp_path / "hold-epoch-1").touch()
    ckpt = CheckpointManager(tmp_path / "ckpt")
    # One checkpoint, due exactly at epoch 1's last commit: an epoch is STEPS_PER_EPOCH batch
    # commits and one at its end.  (Every commit due would let that one be skipped while the
    # previous write is still in flight, and no commit follows during the hold.)
    with boundary_job(tmp_path, "--checkpoint-every", str(2 * STEPS_PER_EPOCH + 1)) as job:
        job.start()
        step = held(job, tmp_path, 1)[0]["step"]
        assert step == 2 * STEPS_PER_EPOCH

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


def test_a_peer_dies_between_optimizer_step_and_commit_and_the_update_is_rolled_back(tmp_path):
    (tmp_path / "die-after-step").write_text("1 20")
    with boundary_job(tmp_path) as job:
        job.start().finish(WAIT)
    assert not (tmp_path / "die-after-step").exists(), "rank 1 never reached the fault"
    assert_exactly_once(tmp_path)
    assert [e for e in EventLog.read(tmp_path / "events.jsonl") if e["event"] == "restore"]


def test_a_restore_that_keeps_the_model_is_caught_by_the_verdict(tmp_path):
    """The proof the verdict can see a step applied twice: ranks agree, samples are exactly once,
    and only the rank-independent checks (scheduler, optimizer steps, digests chain) fail."""
    (tmp_path / "die-after-step").write_text("1 20")
    with boundary_job(tmp_path, "--broken-restore") as job:
        job.start().finish(WAIT)
    result = verdict(tmp_path)
    assert result.params_identical and result.lost == result.duplicated == 0, result
    problems = "\n".join(result.problems())
    assert "started from a state that is not what step" in problems, problems
    assert "scheduler last_epoch" in problems and "optimizer state step" in problems, problems
