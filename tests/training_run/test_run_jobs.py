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
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hvd_elastic.training.checkpoint import CheckpointManager
from hvd_elastic.training.events import EventLog

from training_run_helpers import BIN, HERE, subprocess_env

pytestmark = pytest.mark.slow

WORKER = str(HERE / "worker_train.py")
MPI_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
TOTAL_STEPS = 48  # 3 epochs of 256 samples, 16 samples per step


class Job:
    """One launch of the worker: its command, environment, output folder and process."""

    def __init__(self, workdir: Path, launcher: list[str], **env: str) -> None:
        self.workdir = workdir
        self.out = workdir / "out"
        self.out.mkdir(parents=True, exist_ok=True)
        self.ckpt_dir = workdir / "ckpt"
        self.events = workdir / "events.jsonl"
        self.env = subprocess_env(**{"OUT_DIR": str(self.out), "CKPT_DIR": str(self.ckpt_dir),
                                     "EVENT_LOG": str(self.events), "HOROVOD_GLOO_TIMEOUT_SECONDS": "60",
                                     **MPI_ROOT_ENV, **env})
        self.cmd = [*launcher, sys.executable, WORKER]
        self.logs: list[Path] = []
        self.proc: subprocess.Popen | None = None

    def start(self, **env: str) -> "Job":
        for name in ("progress", "result.json"):
            (self.out / name).unlink(missing_ok=True)
        log = self.workdir / f"launch-{len(self.logs)}.log"
        self.logs.append(log)
        with open(log, "w") as f:
            self.proc = subprocess.Popen(self.cmd, env={**self.env, **env}, stdout=f, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        return self

    def log_tail(self) -> str:
        return self.logs[-1].read_text()[-4000:]

    def progress(self) -> dict:
        try:
            return json.loads((self.out / "progress").read_text())
        except (OSError, ValueError):
            return {"step": 0, "size": 0}

    def wait_until(self, what: str, predicate, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert self.proc.poll() is None, f"job exited ({self.proc.returncode}) before {what}:\n{self.log_tail()}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{self.log_tail()}"
            time.sleep(0.1)

    def finish(self, timeout: float = 300.0) -> dict:
        assert self.proc.wait(timeout=timeout) == 0, self.log_tail()
        return json.loads((self.out / "result.json").read_text())

    def kill(self) -> None:
        """The whole job at once: launcher, workers and everything they started."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            procs = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            procs = []
        for p in procs:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        psutil.wait_procs(procs, timeout=10)

    def checkpoint_steps(self) -> list[int]:
        return [json.loads(p.read_text())["step"] for p in CheckpointManager(self.ckpt_dir).checkpoints()]

    def temp_files(self) -> list[str]:
        return [n for n in os.listdir(self.ckpt_dir) if n.startswith(".tmp-")] if self.ckpt_dir.exists() else []


def horovodrun_elastic(hosts_file: Path, *extra: str) -> list[str]:
    """Elastic horovodrun whose hosts are whatever ``hosts_file`` says at each discovery."""
    discover = hosts_file.with_suffix(".sh")
    discover.write_text(f"#!/bin/sh\ncat {hosts_file}\n")
    discover.chmod(0o755)
    return [str(BIN / "horovodrun"), "-np", "2", "--min-np", "2", "--max-np", "3",
            "--host-discovery-script", str(discover), *extra]


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
    job = Job(tmp_path_factory.mktemp("static"), [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2"])
    try:
        result = job.start().finish()
    finally:
        job.kill()
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
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:1\n127.0.0.1:1\n")
    job = Job(tmp_path, horovodrun_elastic(hosts))
    try:
        # 1. Kill everything at a random step after the first checkpoint.
        kill_step = random.randint(8, 25)  # leaves room for phase 2's two checkpoints
        job.start()
        job.wait_until(f"step {kill_step}", lambda: job.progress()["step"] >= kill_step)
        job.kill()
        durable = job.checkpoint_steps()
        assert durable, f"no checkpoint by step {kill_step}"

        # 2. Restart; checkpoint writes stall from 8 steps after the resume point, so
        #    one more checkpoint (resume + 5) lands and the next (resume + 10) is
        #    killed mid-write.
        stall_step = durable[0] + 10
        job.start(SLOW_WRITES_FROM_STEP=str(durable[0] + 8))
        job.wait_until("a stalled checkpoint write",
                       lambda: job.progress()["step"] > stall_step and bool(job.temp_files()))
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
        result = job.start().finish()
    finally:
        job.kill()

    assert_same_training(result, reference["result"])
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
    job = Job(tmp_path, mpirun(), MPI_COMM="1")
    shutil.copytree(reference["ckpt_dir"], job.ckpt_dir)
    for manifest in CheckpointManager(job.ckpt_dir).checkpoints()[:2]:  # drop steps 48 and 45
        manifest.unlink()
    try:
        result = job.start().finish()
    finally:
        job.kill()
    assert_same_training(result, reference["result"])
    events = EventLog.read(job.events)
    names = [e["event"] for e in events]
    assert [e["step"] for e in events if e["event"] == "resume"] == [40]
    assert names.count("commit") == TOTAL_STEPS - 40 and "reset" not in names and names[-1] == "finish"


def test_elastic_resets_are_logged_with_reason_and_sizes(tmp_path):
    """Join (2 -> 3), kill -9 of the joined worker (3 -> 2), then stop: the event log tells it.

    The job starts on localhost:2 alone (``--network-interface lo`` lets elastic
    horovodrun start on one host), so rank 0 stays on localhost and 127.0.0.1's
    worker can be killed without touching the event log's writer.
    """
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    # Survivors of a kill -9 may wait for Gloo's timeout before they see the error;
    # 30 s still covers a joining worker's start-up on a loaded machine.
    job = Job(tmp_path, horovodrun_elastic(hosts, "--network-interface", "lo"),
              STOP_FILE=str(tmp_path / "stop"), STEP_SLEEP="0.1", HOROVOD_GLOO_TIMEOUT_SECONDS="30")
    try:
        job.start()
        job.wait_until("2 ranks training", lambda: job.progress()["size"] == 2 and job.progress()["step"] >= 3)
        hosts.write_text("localhost:2\n127.0.0.1:1\n")
        job.wait_until("3 ranks training", lambda: job.progress()["size"] == 3)
        pid_file = job.out / "worker-127.0.0.1-0.pid"
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        job.wait_until("2 ranks again", lambda: job.progress()["size"] == 2)
        step = job.progress()["step"]
        job.wait_until("a few more steps", lambda: job.progress()["step"] >= step + 3)
        (tmp_path / "stop").touch()
        job.finish()
    finally:
        job.kill()
    events = EventLog.read(job.events)
    resets = [e for e in events if e["event"] == "reset"]
    sizes = [(e["reason"], e["old_size"], e["new_size"]) for e in resets]
    # Blacklisting 127.0.0.1 may reach rank 0 later as a removal: a 2 -> 2 reset.
    assert sizes[:2] == [("hosts_updated", 2, 3), ("internal_error", 3, 2)], resets
    assert all(s == ("hosts_updated", 2, 2) for s in sizes[2:]), resets
    assert resets[0]["hosts"] == "added"
    assert resets[1]["message"].startswith("HorovodInternalError")
    names = [e["event"] for e in events]
    assert "restore" in names and names.count("sync") >= 2 and names[-1] == "finish"
    # All records come from rank 0 and carry their context.
    assert {e["rank"] for e in events} == {0}
    assert all({"time", "size", "host", "pid"} <= e.keys() for e in events)
