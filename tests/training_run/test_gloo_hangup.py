"""Hanging up a failed rank's Gloo connections: the peer fails at once, the user's connections stay.

Real processes: two ranks under horovodrun with Gloo (see gloo_hangup_worker.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hvd_elastic.testbed import VENV_BIN, child_env

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("gloo_hangup_worker.py")
GLOO_TIMEOUT = 120  # beyond rank 0's patience: only a hang-up or rank 0's exit ends rank 1's wait


def run(tmp_path: Path, hangup: str) -> tuple[dict, dict]:
    cmd = [str(VENV_BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", str(VENV_BIN / "python"),
           str(WORKER), str(tmp_path)]
    env = child_env(HOROVOD_GLOO_TIMEOUT_SECONDS=str(GLOO_TIMEOUT), HVD_ELASTIC_GLOO_HANGUP=hangup)
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"rank 1 was still waiting after 60 s (HVD_ELASTIC_GLOO_HANGUP={hangup})") from exc
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return tuple(json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))


def test_the_waiting_peer_fails_at_once_and_user_connections_survive(tmp_path):
    rank0, rank1 = run(tmp_path, "1")
    assert rank0["found"] >= 1 and rank0["hung_up"] == rank0["found"]
    assert rank0["user_sockets_found"] == []  # neither its own connection nor an asyncio-shaped epoll
    assert rank0["user_connection_works"] is True
    assert rank1["error"] is not None and "Timed out" not in rank1["error"], rank1
    assert rank1["rank0_had_finished"] is False  # the hang-up told it, not rank 0's exit


def test_without_the_hang_up_the_peer_hears_only_when_the_process_ends(tmp_path):
    rank0, rank1 = run(tmp_path, "0")
    assert rank0["hung_up"] == 0 and rank0["found"] >= 1
    assert rank1["error"] is not None and rank1["rank0_had_finished"] is True
