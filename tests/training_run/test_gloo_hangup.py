"""Hanging up a failed rank's Gloo connections: the peer fails at once, the user's connections stay.

Real processes: two ranks under horovodrun with Gloo (see gloo_hangup_worker.py), and
real sockets on loopback for the shape of Gloo's event loop after a crash.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import struct
import subprocess
from pathlib import Path

import pytest

from hvd_elastic.consul.config import ConfigError
from hvd_elastic.testbed import VENV_BIN, child_env
from hvd_elastic.training import gloo_hangup

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


@pytest.mark.slow
def test_the_waiting_peer_fails_at_once_and_user_connections_survive(tmp_path):
    rank0, rank1 = run(tmp_path, "1")
    assert rank0["found"] >= 1 and rank0["hung_up"] == rank0["found"]
    assert rank0["user_sockets_found"] == []  # neither its own connection nor an asyncio-shaped epoll
    assert rank0["user_connection_works"] is True
    assert rank1["error"] is not None and "Timed out" not in rank1["error"], rank1
    assert rank1["rank0_had_finished"] is False  # the hang-up told it, not rank 0's exit


@pytest.mark.slow
def test_without_the_hang_up_the_peer_hears_only_when_the_process_ends(tmp_path):
    rank0, rank1 = run(tmp_path, "0")
    assert rank0["hung_up"] == 0 and rank0["found"] >= 1
    assert rank1["error"] is not None and rank1["rank0_had_finished"] is True


def _reset_by_peer(server: socket.socket) -> socket.socket:
    """A client socket whose peer has gone with a reset (what a SIGKILLed rank's host leaves)."""
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    accepted.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close sends RST
    accepted.close()
    with pytest.raises(OSError):  # the reset has arrived
        client.settimeout(5)
        client.recv(1)
        client.recv(1)
    return client


def test_a_gloo_shaped_loop_is_recognised_even_with_a_peer_already_reset():
    # A survivor that lost two peers: one of its pairs is reset, still registered; the live one must be hung up.
    with socket.create_server(("127.0.0.1", 0)) as server, contextlib.ExitStack() as stack:
        live = stack.enter_context(socket.create_connection(server.getsockname()))
        live_peer = stack.enter_context(server.accept()[0])
        dead = stack.enter_context(_reset_by_peer(server))
        wake_r, wake_w = os.pipe()
        stack.callback(os.close, wake_r)
        stack.callback(os.close, wake_w)
        gloo_loop = stack.enter_context(select.epoll())
        for fd in (wake_r, live.fileno(), dead.fileno()):
            gloo_loop.register(fd, select.EPOLLIN)
        # Shaped otherwise: asyncio's wake-up socket pair, a listener: left alone.
        a, b = socket.socketpair()
        stack.enter_context(a), stack.enter_context(b)
        user_loop = stack.enter_context(select.epoll())
        for fd in (a.fileno(), server.fileno()):
            user_loop.register(fd, select.EPOLLIN)

        assert gloo_hangup.gloo_sockets() == sorted([live.fileno(), dead.fileno()])
        assert gloo_hangup.hang_up() == sorted([live.fileno(), dead.fileno()])
        live_peer.settimeout(5)
        assert live_peer.recv(1) == b""  # the live pair's peer reads the end of the stream now


def test_a_bad_switch_value_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv(gloo_hangup.ENV, "sometimes")
    with pytest.raises(ConfigError, match="HVD_ELASTIC_GLOO_HANGUP='sometimes' is not a boolean"):
        gloo_hangup.enabled()
    monkeypatch.setenv(gloo_hangup.ENV, "0")
    assert gloo_hangup.enabled() is False and gloo_hangup.hang_up() == []
