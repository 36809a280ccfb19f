"""The shared-checkpoint-directory check in real jobs: elastic horovodrun on two "hosts", localhost and 127.0.0.1.

Both are this machine, so a directory per host is simulated honestly by the path itself:
``CKPT_DIR=.../ckpt-{host}`` becomes ``ckpt-localhost`` for one rank and ``ckpt-127.0.0.1`` for the
other (worker_train.py substitutes Horovod's host name), which is what node-local disks amount
to.  Each job must: pass with one shared directory and leave no marker; refuse a directory per
host on every rank, naming the host that does not see rank 0's marker; train with the override;
and refuse a host that joins a running job later.  The same on netns hosts over ssh:
tests/multihost/test_shared_checkpoint_dir.py.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from testbed import Job, child_env, horovodrun_elastic, host_file_discovery
from hvd_elastic.training._internal import shared_dir
from hvd_elastic.training.checkpoint import CheckpointManager

pytestmark = pytest.mark.slow

WORKER = Path(__file__).parent / "worker_train.py"
HOSTS = ("localhost", "127.0.0.1")
WAIT = 240.0  # hang guards, not speed bounds
REFUSAL = "SharedDirError: checkpoint_dir"


def label(host: str) -> str:
    """How the check names a rank on ``host`` (socket.gethostname(), then Horovod's name where it differs)."""
    name = socket.gethostname()
    return name if host == name else f"{name} as {host}"


def start(tmp_path: Path, launcher: list[str], ckpt: Path | str, **env: str) -> Job:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    job = Job([*launcher, sys.executable, WORKER], logdir=tmp_path, name="launch",
              env=child_env(OUT_DIR=str(out), CKPT_DIR=str(ckpt), EPOCHS="1", HOROVOD_GLOO_TIMEOUT_SECONDS="60",
                            **env))
    return job.start()


def two_hosts(tmp_path: Path) -> list[str]:
    return horovodrun_elastic(host_file_discovery(tmp_path / "hosts", "localhost:1\n127.0.0.1:1\n"), 2, 2, 2)


def markers(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if shared_dir.is_marker(p.name)] if directory.exists() else []


def refusal_lines(job: Job) -> list[str]:
    return [line for line in job.read_log().splitlines() if REFUSAL in line]


def test_a_shared_directory_passes_and_leaves_no_marker(tmp_path):
    with start(tmp_path, two_hosts(tmp_path), tmp_path / "ckpt") as job:
        job.finish(WAIT)
    assert json.loads((tmp_path / "out" / "result.json").read_text())["size"] == 2
    assert CheckpointManager(tmp_path / "ckpt").checkpoints(), "the job wrote no checkpoint"
    assert markers(tmp_path / "ckpt") == []
    assert not refusal_lines(job)


def test_a_directory_per_host_is_refused_on_every_rank_naming_the_host(tmp_path):
    with start(tmp_path, two_hosts(tmp_path), tmp_path / "ckpt-{host}") as job:
        code = job.wait(WAIT)
    lines = refusal_lines(job)
    assert code != 0, job.log_tail()
    assert {line[:3] for line in lines} == {"[0]", "[1]"}, job.log_tail()  # every rank stops, none hangs
    message = lines[0].split("SharedDirError: ", 1)[1]
    rank0 = next(h for h in HOSTS if f"rank 0 wrote there on {label(h)} is not seen" in message)
    other = next(h for h in HOSTS if h != rank0)
    assert f"checkpoint_dir {tmp_path / f'ckpt-{rank0}'} is not shared" in message, message
    assert f"is not seen on {label(other)} (rank 1) (no such file)" in message, message
    assert "checkpoint_dir_shared=False" in message and "HVD_ELASTIC_CHECKPOINT_LOCAL=1" in message
    assert not (tmp_path / "out" / "progress").exists(), "a step was trained before the refusal"
    for host in HOSTS:
        assert markers(tmp_path / f"ckpt-{host}") == []
        assert CheckpointManager(tmp_path / f"ckpt-{host}").checkpoints() == []


def test_the_override_trains_with_a_directory_per_host(tmp_path):
    with start(tmp_path, two_hosts(tmp_path), tmp_path / "ckpt-{host}", HVD_ELASTIC_CHECKPOINT_LOCAL="1") as job:
        job.finish(WAIT)
    assert not refusal_lines(job)
    written = {h: CheckpointManager(tmp_path / f"ckpt-{h}").checkpoints() for h in HOSTS}
    # Rank 0 writes them, into its own host's directory; the other directory stays empty.
    assert sorted(bool(c) for c in written.values()) == [False, True], written


def test_a_host_that_joins_later_is_checked_when_it_joins(tmp_path):
    hosts = tmp_path / "hosts"
    discover = host_file_discovery(hosts, "localhost:1\n")
    launcher = horovodrun_elastic(discover, 1, 1, 2, "--network-interface", "lo")
    progress = tmp_path / "out" / "progress"
    with start(tmp_path, launcher, tmp_path / "ckpt-{host}", STOP_FILE=str(tmp_path / "stop"),
               STEP_SLEEP="0.1") as job:
        job.wait_until("training at size 1",
                       lambda: progress.exists() and json.loads(progress.read_text())["step"] >= 3, WAIT)
        hosts.write_text("localhost:1\n127.0.0.1:1\n")
        code = job.wait(WAIT)
    lines = refusal_lines(job)
    assert code != 0, job.log_tail()
    assert {line[:3] for line in lines} == {"[0]", "[1]"}, job.log_tail()
    message = lines[0]
    assert (f"rank 0 wrote there on {label('localhost')} is not seen on {label('127.0.0.1')} (rank 1)"
            in message), message
    assert json.loads(progress.read_text())["size"] == 1, "the newcomer trained before it was checked"
    assert markers(tmp_path / "ckpt-localhost") == []
