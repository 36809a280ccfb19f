"""The run decorator in real jobs: static horovodrun, mpirun, elastic horovodrun,
whole-job loss (SIGKILL of every process, once mid-checkpoint-write), a corrupted
newest checkpoint, and the event log of resets.

The worker (worker_train.py) is deterministic at a fixed world size, so every run
that ends at 2 ranks must end with the parameters of the uninterrupted reference.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from testbed import MPI_ROOT_ENV, VENV_BIN, Job, child_env, horovodrun_elastic, host_file_discovery
from hvd_elastic.training.checkpoint import CheckpointManager
from hvd_elastic.training.events import EventLog

pytestmark = pytest.mark.slow

WORKER = Path(__file__).parent / "worker_train.py"
TOTAL_STEPS = 48  # 3 epochs of 256 samples, 16 samples per step
WAIT = 240.0  # seconds a job may take to reach a state: hang guards, not speed bounds
FINISH = 300.0


class TrainJob(Job):
    """The worker under ``launcher``, with its output folder, checkpoints and event log."""

    def __init__(self, workdir: Path, launcher: list[str], **env: str) -> None:
        self.workdir = workdir
        self.out = workdir / "out"
        self.out.mkdir(parents=True, exist_ok=True)
        self.ckpt_dir = workdir / "ckpt"
        self.events = workdir / "events.jsonl"
        super().__init__([*launcher, sys.executable, WORKER], logdir=workdir, name="launch",
                         env=child_env(**{"OUT_DIR": str(self.out), "CKPT_DIR": str(self.ckpt_dir),
                                          "EVENT_LOG": str(self.events), "HOROVOD_GLOO_TIMEOUT_SECONDS": "60",
                                          **MPI_ROOT_ENV, **env}))  # ``env`` may override the defaults

    def start(self, **env: str) -> "TrainJob":
        for name in ("progress", "result.json"):  # what the previous attempt left
            (self.out / name).unlink(missing_ok=True)
        return super().start(**env)

    def progress(self) -> dict:
        try:
            return json.loads((self.out / "progress").read_text())
        except (OSError, ValueError):
            return {"step": 0, "size": 0}

    def result(self) -> dict:
        """What rank 0 wrote at the end of a finished attempt."""
        return json.loads((self.out / "result.json").read_text())

    def checkpoint_steps(self) -> list[int]:
        return [json.loads(p.read_text())["step"] for p in CheckpointManager(self.ckpt_dir).checkpoints()]

    def temp_files(self) -> list[str]:
        return [n for n in os.listdir(self.ckpt_dir) if n.startswith(".tmp-")] if self.ckpt_dir.exists() else []


def mpirun() -> list[str]:
    return ["mpirun", "--oversubscribe", "-np", "2", "-x", "PATH", "-x", "PYTHONPATH", "-x", "PYTHONUNBUFFERED",
            "-x", "OUT_DIR", "-x", "CKPT_DIR", "-x", "EVENT_LOG", "-x", "MPI_COMM"]


def assert_same_training(result: dict, reference: dict) -> None:
    assert result["step"] == TOTAL_STEPS and result["size"] == 2
    for key in ("params_sha256", "lr", "offset", "epoch"):
        assert result[key] == reference[key], f"{key}: {result[key]} != reference {reference[key]}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """An uninterrupted run under a STATIC horovodrun (-np 2, no elastic flags): the
    static-launch test and the reference every other run is compared with."""
    with TrainJob(tmp_path_factory.mktemp("static"),
                  [str(VENV_BIN / "horovodrun"), "-np", "2", "-H", "localhost:2"]) as job:
        job.start().finish(FINISH)
    result = job.result()
    events = EventLog.read(job.events)
    names = [e["event"] for e in events]
    return {"result": result, "events": names, "checkpoints": job.checkpoint_steps(), "ckpt_dir": job.ckpt_dir}


def test_static_horovodrun_runs_the_decorated_function_unchanged(reference):
    result, names = reference["result"], reference["events"]
    assert result["step"] == TOTAL_STEPS and result["size"] == 2 and result["offset"] == 256
    assert names[:2] == ["sync", "start"] and names[-1] == "finish"
    assert "reset" not in names and "resume" not in names
    assert names.count("commit") == TOTAL_STEPS
    # Every 5 commits, the final step at exit, the last three kept.
    assert names.count("checkpoint") == TOTAL_STEPS // 5 + 1
    assert reference["checkpoints"] == [48, 45, 40]


def test_whole_job_loss_resumes_from_the_last_durable_checkpoint(reference, tmp_path):
    discover = host_file_discovery(tmp_path / "hosts", "localhost:1\n127.0.0.1:1\n")
    with TrainJob(tmp_path, horovodrun_elastic(discover, 2, 2, 3)) as job:
        # 1. Kill everything at a random step after the first checkpoint.
        kill_step = random.randint(8, 25)  # leaves room for phase 2's two checkpoints
        job.start()
        job.wait_until(f"step {kill_step}", lambda: job.progress()["step"] >= kill_step, WAIT)
        job.kill()
        durable = job.checkpoint_steps()
        assert durable, f"no checkpoint by step {kill_step}"

        # 2. Restart; checkpoint writes stall from 8 steps after the resume point, so
        #    one more checkpoint (resume + 5) lands and the next (resume + 10) is
        #    killed mid-write.
        stall_step = durable[0] + 10
        job.start(SLOW_WRITES_FROM_STEP=str(durable[0] + 8))
        job.wait_until("a stalled checkpoint write",
                       lambda: job.progress()["step"] > stall_step and bool(job.temp_files()), WAIT)
        job.kill()
        assert job.temp_files(), "the kill should have left the write's temporary file"
        after_stall = job.checkpoint_steps()
        assert after_stall[0] == durable[0] + 5, (durable, after_stall)

        # 3. Corrupt the newest durable checkpoint; the restart must skip it with a
        #    warning naming the file, resume from the one before, and finish.
        newest = CheckpointManager(job.ckpt_dir).checkpoints()[0]
        payload = job.ckpt_dir / json.loads(newest.read_text())["payload"]
        data = bytearray(payload.read_bytes())
        data[len(data) // 3] ^= 0x5A
        payload.write_bytes(bytes(data))
        job.start().finish(FINISH)

    assert_same_training(job.result(), reference["result"])
    assert f"skipping checkpoint {payload}" in job.logs[-1].read_text()
    events = EventLog.read(job.events)
    resumes = [e for e in events if e["event"] == "resume"]
    assert [r["step"] for r in resumes] == [durable[0], durable[0]], resumes
    skipped = [e for e in events if e["event"] == "checkpoint_skipped"]
    assert [e["path"] for e in skipped] == [str(payload)]
    assert "checksum mismatch" in skipped[0]["reason"]
    assert not job.temp_files(), "the restart should remove the interrupted write's leftovers"
    assert [e["event"] for e in events].count("finish") == 1


def test_mpirun_resumes_a_checkpoint_written_under_horovodrun(reference, tmp_path):
    """Plain mpirun (hvd.init(comm=MPI.COMM_WORLD)) picks up the static run's step-40
    checkpoint and finishes exactly like the uninterrupted run."""
    with TrainJob(tmp_path, mpirun(), MPI_COMM="1") as job:
        shutil.copytree(reference["ckpt_dir"], job.ckpt_dir)
        for manifest in CheckpointManager(job.ckpt_dir).checkpoints()[:2]:  # drop steps 48 and 45
            manifest.unlink()
        job.start().finish(FINISH)
    assert_same_training(job.result(), reference["result"])
    events = EventLog.read(job.events)
    names = [e["event"] for e in events]
    assert [e["step"] for e in events if e["event"] == "resume"] == [40]
    assert names.count("commit") == TOTAL_STEPS - 40 and "reset" not in names and names[-1] == "finish"


def a_few_more_steps_then_stop(job: TrainJob, stop_file: Path) -> list[dict]:
    """Let ``job`` commit three more steps, stop it through ``stop_file``; its event log."""
    step = job.progress()["step"]
    job.wait_until("a few more steps", lambda: job.progress()["step"] >= step + 3, WAIT)
    stop_file.touch()
    job.finish(FINISH)
    return EventLog.read(job.events)


def test_elastic_resets_are_logged_with_reason_and_sizes(tmp_path):
    """Join (2 -> 3), kill -9 of the joined worker (3 -> 2), then stop: the event log tells it.

    The job starts on localhost:2 alone (``--network-interface lo`` lets elastic
    horovodrun start on one host), so rank 0 stays on localhost and 127.0.0.1's
    worker can be killed without touching the event log's writer.
    """
    hosts = tmp_path / "hosts"
    discover = host_file_discovery(hosts, "localhost:2\n")
    # Survivors of a kill -9 may wait for Gloo's timeout before they see the error;
    # 30 s still covers a joining worker's start-up on a loaded machine.
    with TrainJob(tmp_path, horovodrun_elastic(discover, 2, 2, 3, "--network-interface", "lo"),
                  STOP_FILE=str(tmp_path / "stop"), STEP_SLEEP="0.1", HOROVOD_GLOO_TIMEOUT_SECONDS="30") as job:
        job.start()
        job.wait_until("2 ranks training", lambda: job.progress()["size"] == 2 and job.progress()["step"] >= 3, WAIT)
        hosts.write_text("localhost:2\n127.0.0.1:1\n")
        job.wait_until("3 ranks training", lambda: job.progress()["size"] == 3, WAIT)
        pid_file = job.out / "worker-127.0.0.1-0.pid"
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        job.wait_until("2 ranks again", lambda: job.progress()["size"] == 2, WAIT)
        events = a_few_more_steps_then_stop(job, tmp_path / "stop")
    resets = [e for e in events if e["event"] == "reset"]
    sizes = [(e["reason"], e["old_size"], e["new_size"]) for e in resets]
    # Blacklisting 127.0.0.1 may reach rank 0 later as a removal: a 2 -> 2 reset.
    assert sizes[:2] == [("hosts_updated", 2, 3), ("internal_error", 3, 2)], resets
    assert all(s == ("hosts_updated", 2, 2) for s in sizes[2:]), resets
    assert resets[0]["hosts"] == "added"
    assert resets[0]["joined_ahead"] is True  # the survivors trained on while the newcomer started
    assert resets[1]["message"].startswith("HorovodInternalError")
    names = [e["event"] for e in events]
    assert "restore" in names and names.count("sync") >= 2 and names[-1] == "finish"
    # All records come from rank 0 and carry their context.
    assert {e["rank"] for e in events} == {0}
    assert all({"time", "size", "host", "pid"} <= e.keys() for e in events)


def test_a_newcomer_that_dies_before_its_rendezvous_never_stops_the_survivors(tmp_path):
    """Join-ahead's give-up path: the survivors train on at 2 while the newcomer dies; after Gloo's
    timeout they re-initialise the stock way and the driver starts the next world without it.

    (Stock Horovod's survivors would wait in the new world's rendezvous for it, and abort there.)
    """
    hosts = tmp_path / "hosts"
    discover = host_file_discovery(hosts, "localhost:2\n")
    with TrainJob(tmp_path, horovodrun_elastic(discover, 2, 2, 3, "--network-interface", "lo"),
                  STOP_FILE=str(tmp_path / "stop"), STEP_SLEEP="0.1", HOROVOD_GLOO_TIMEOUT_SECONDS="8",
                  FAIL_ON_HOST="127.0.0.1") as job:
        job.start()
        job.wait_until("2 ranks training", lambda: job.progress()["size"] == 2 and job.progress()["step"] >= 3, WAIT)
        added = time.time()
        hosts.write_text("localhost:2\n127.0.0.1:1\n")
        job.wait_until("the give-up reset", lambda: any(e["event"] == "reset" for e in EventLog.read(job.events)),
                       WAIT)
        events = a_few_more_steps_then_stop(job, tmp_path / "stop")
    resets = [e for e in events if e["event"] == "reset"]
    first = resets[0]
    assert (first["reason"], first["hosts"], first["old_size"], first["new_size"], first["joined_ahead"]) == (
        "hosts_updated", "added", 2, 2, False), resets
    # Blacklisting 127.0.0.1 may reach rank 0 later as a removal: a 2 -> 2 reset; size 3 never formed.
    assert all(e["new_size"] == 2 for e in resets), resets
    assert resets[0]["interrupted_at"] - added >= 8  # trained on through the whole wait
    assert "restore" not in [e["event"] for e in events]
    assert events[-1]["event"] == "finish"
