"""Smoke tests of the toolchain: real horovodrun (static and elastic) and mpirun."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from testbed import MPI_ROOT_ENV, VENV_BIN, Job, WorldSizes, child_env, horovodrun_elastic, host_file_discovery

HERE = Path(__file__).parent

pytestmark = pytest.mark.slow


def _results(smoke_dir: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(smoke_dir.glob("result.*.json"))]


def test_horovodrun_gloo_allreduce(tmp_path):
    cmd = [VENV_BIN / "horovodrun", "--gloo", "-np", "2", "-H", "localhost:2", sys.executable,
           HERE / "worker_allreduce.py"]
    with Job(cmd, env=child_env(SMOKE_DIR=str(tmp_path)), logdir=tmp_path, name="horovodrun") as job:
        job.start().finish(timeout=180)
    results = _results(tmp_path)
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert all(r["size"] == 2 and r["sum"] == 3.0 for r in results)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI is installed by scripts/bootstrap.sh")
def test_mpirun_with_mpi4py_comm_world(tmp_path):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
           "-x", "PATH", "-x", "PYTHONUNBUFFERED", "-x", "SMOKE_DIR",
           sys.executable, HERE / "worker_allreduce.py", "--mpi-comm"]
    # The Job owns the ranks too: a hang or a failure kills mpirun AND every rank.
    with Job(cmd, env=child_env(SMOKE_DIR=str(tmp_path), **MPI_ROOT_ENV), logdir=tmp_path, name="mpirun") as job:
        job.start().finish(timeout=180)
    results = _results(tmp_path)
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert all(r["size"] == 2 and r["mpi_size"] == 2 and r["sum"] == 3.0 and r["mpi_built"] for r in results)


def test_elastic_join_then_leave(tmp_path):
    hosts = tmp_path / "hosts"
    discover = host_file_discovery(hosts, "localhost:1\n127.0.0.1:1\n")
    cmd = [*horovodrun_elastic(discover, 2, 1, 4), sys.executable, HERE / "worker_elastic.py"]
    sizes = WorldSizes(tmp_path / "sizes.*.jsonl")
    env = child_env(SMOKE_DIR=str(tmp_path), HOROVOD_GLOO_TIMEOUT_SECONDS="60")
    with Job(cmd, env=env, logdir=tmp_path, name="horovodrun") as job:
        job.start()
        sizes.wait_for_size(job, 2, timeout=90)
        since = time.time()
        hosts.write_text("localhost:2\n127.0.0.1:1\n")  # a slot joins
        sizes.wait_for_size(job, 3, timeout=90, since=since)
        since = time.time()
        hosts.write_text("localhost:2\n")  # 127.0.0.1 leaves
        sizes.wait_for_size(job, 2, timeout=90, since=since)
        (tmp_path / "stop").touch()
        assert job.wait(timeout=120) == 0, job.log_tail()
    assert sizes.sequence() == [2, 3, 2], job.log_tail(3000)
    # Every rank of each world size took part (ranks 0..size-1 all logged steps).
    ranks_by_size: dict[int, set[int]] = {}
    for row in sizes.rows():
        ranks_by_size.setdefault(row["size"], set()).add(row["rank"])
    assert ranks_by_size == {2: {0, 1}, 3: {0, 1, 2}}
