"""Smoke tests of the toolchain: real horovodrun (static and elastic) and mpirun."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
BIN = Path(sys.executable).parent
MPI_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}

pytestmark = pytest.mark.slow


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def _results(smoke_dir: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(smoke_dir.glob("result.*.json"))]


def test_horovodrun_gloo_allreduce(tmp_path):
    out = subprocess.run(
        [str(BIN / "horovodrun"), "--gloo", "-np", "2", "-H", "localhost:2",
         sys.executable, str(HERE / "worker_allreduce.py")],
        env=_env(SMOKE_DIR=str(tmp_path)), capture_output=True, text=True, timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = _results(tmp_path)
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert all(r["size"] == 2 and r["sum"] == 3.0 for r in results)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI is installed by scripts/bootstrap.sh")
def test_mpirun_with_mpi4py_comm_world(tmp_path):
    out = subprocess.run(
        ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
         "-x", "PATH", "-x", "PYTHONUNBUFFERED", "-x", "SMOKE_DIR",
         sys.executable, str(HERE / "worker_allreduce.py"), "--mpi-comm"],
        env=_env(SMOKE_DIR=str(tmp_path), **MPI_ROOT_ENV), capture_output=True, text=True, timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = _results(tmp_path)
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert all(r["size"] == 2 and r["mpi_size"] == 2 and r["sum"] == 3.0 and r["mpi_built"] for r in results)


class _Sizes:
    def __init__(self, smoke_dir: Path):
        self.smoke_dir = smoke_dir

    def records(self) -> list[dict]:
        rows = []
        for path in glob.glob(str(self.smoke_dir / "sizes.*.jsonl")):
            with open(path) as f:
                rows.extend(json.loads(line) for line in f if line.strip())
        return rows

    def sequence(self) -> list[int]:
        """World sizes rank 0 saw, in step order, with repeats collapsed."""
        seq: list[int] = []
        for row in sorted((r for r in self.records() if r["rank"] == 0), key=lambda r: r["step"]):
            if not seq or seq[-1] != row["size"]:
                seq.append(row["size"])
        return seq

    def wait_for_size(self, size: int, proc: subprocess.Popen, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seq = self.sequence()
            if seq and seq[-1] == size:
                return
            assert proc.poll() is None, f"horovodrun exited early with {proc.returncode}"
            time.sleep(0.3)
        raise AssertionError(f"world size never reached {size}; saw {self.sequence()}")


def test_elastic_join_then_leave(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:1\n127.0.0.1:1\n")
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    log = open(tmp_path / "horovodrun.log", "w")
    proc = subprocess.Popen(
        [str(BIN / "horovodrun"), "-np", "2", "--min-np", "1", "--max-np", "4",
         "--host-discovery-script", str(discover),
         sys.executable, str(HERE / "worker_elastic.py")],
        env=_env(SMOKE_DIR=str(tmp_path), HOROVOD_GLOO_TIMEOUT_SECONDS="60"),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    sizes = _Sizes(tmp_path)
    try:
        sizes.wait_for_size(2, proc)
        hosts.write_text("localhost:2\n127.0.0.1:1\n")  # a slot joins
        sizes.wait_for_size(3, proc)
        hosts.write_text("localhost:2\n")  # 127.0.0.1 leaves
        sizes.wait_for_size(2, proc)
        (tmp_path / "stop").touch()
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    assert sizes.sequence() == [2, 3, 2], (tmp_path / "horovodrun.log").read_text()[-3000:]
    # Every rank of each world size took part (ranks 0..size-1 all logged steps).
    ranks_by_size: dict[int, set[int]] = {}
    for row in sizes.records():
        ranks_by_size.setdefault(row["size"], set()).add(row["rank"])
    assert ranks_by_size == {2: {0, 1}, 3: {0, 1, 2}}
