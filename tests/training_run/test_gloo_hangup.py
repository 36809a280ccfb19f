"""Hanging up a failed rank's Gloo connections: the peer fails at once, the user's connections stay.

Real processes: two ranks under horovodrun with Gloo (gloo_hangup_worker.py: a peer waiting on
a failed rank; gloo_mismatch_worker.py: a failure that loses no peer), and real sockets on
loopback for the shapes of event loops (gloo_shapes.GlooLikeLoop registers as Gloo does).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gloo_shapes import GlooLikeLoop
from testbed import VENV_BIN, child_env, horovodrun_elastic, host_file_discovery
from hvd_elastic.training._internal import gloo_hangup

WORKER = Path(__file__).with_name("gloo_hangup_worker.py")
MISMATCH_WORKER = Path(__file__).with_name("gloo_mismatch_worker.py")
GLOO_TIMEOUT = 120  # beyond rank 0's patience: only a hang-up or rank 0's exit ends rank 1's wait


def run(tmp_path: Path, hangup: str) -> tuple[dict, dict]:
    cmd = [str(VENV_BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", str(VENV_BIN / "python"),
           str(WORKER), str(tmp_path)]
    env = child_env(HOROVOD_GLOO_TIMEOUT_SECONDS=str(GLOO_TIMEOUT), HVD_ELASTIC_GLOO_HANGUP=hangup)
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        reports = {p.name: p.read_text() for p in tmp_path.glob("rank*.json")}
        raise AssertionError(f"rank 1 was still waiting after 60 s (HVD_ELASTIC_GLOO_HANGUP={hangup}); "
                             f"reports {reports}; "
                             f"output {(exc.stderr or b'')[-2000:]!r}") from exc
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return tuple(json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))


@pytest.mark.slow
def test_the_waiting_peer_fails_at_once_and_user_connections_survive(tmp_path):
    rank0, rank1 = run(tmp_path, "1")
    assert rank0["found"] >= 1 and rank0["hung_up"] == rank0["found"]
    # Neither its own connection, nor an asyncio-shaped epoll, nor a selectors loop woken by a pipe.
    assert rank0["user_sockets_found"] == []
    assert rank0["user_connection_works"] is True
    assert rank1["error"] is not None and "Timed out" not in rank1["error"], rank1
    assert rank1["rank0_had_finished"] is False  # the hang-up told it, not rank 0's exit


@pytest.mark.slow
def test_without_the_hang_up_the_peer_hears_only_when_the_process_ends(tmp_path):
    rank0, rank1 = run(tmp_path, "0")
    assert rank0["hung_up"] == 0 and rank0["found"] >= 1
    assert rank1["error"] is not None and rank1["rank0_had_finished"] is True


@pytest.mark.slow
def test_a_failure_that_loses_no_peer_recovers_without_waiting_on_a_timeout(tmp_path):
    """Both ranks fail one allreduce while their background loops keep cycling: cutting that live world made
    one rank's Horovod wait in ``hvd.shutdown()`` for the Gloo timeout one run in ten under load (a send
    Gloo had queued after EPIPE, never failed); the hang-up waits until the world is quiet, so it never cuts
    a world that is still talking."""
    discovery = host_file_discovery(tmp_path / "hosts", "localhost:1\n127.0.0.1:1\n")
    cmd = horovodrun_elastic(discovery, 2, 2, 2, sys.executable, str(MISMATCH_WORKER))
    env = child_env(OUT=str(tmp_path), HOROVOD_GLOO_TIMEOUT_SECONDS=str(GLOO_TIMEOUT))
    with open(tmp_path / "output.txt", "w") as output:
        done = subprocess.run(cmd, env=env, stdout=output, stderr=subprocess.STDOUT, timeout=90,
                              start_new_session=True)
    log = (tmp_path / "output.txt").read_text()
    assert done.returncode == 0, log[-3000:]
    assert "no epoll loop shaped like Gloo's" not in log  # run()'s start-up check finds real Gloo's loop
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank in ranks:
        assert "Mismatched ALLREDUCE tensor shapes" in rank["error"], rank
        assert [e["size"] for e in rank["entries"]] == [2, 2]  # nobody was lost
        assert rank["result"] == 3.0  # the next world's allreduce works
        assert rank["entries"][1]["at"] - rank["failed_at"] < 30, "the reset waited on a timeout"


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


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@contextlib.contextmanager
def _client_connections(n: int):
    """``n`` loopback connections: (ours, theirs) pairs."""
    with socket.create_server(("127.0.0.1", 0)) as server, contextlib.ExitStack() as stack:
        pairs = []
        for _ in range(n):
            ours = stack.enter_context(socket.create_connection(server.getsockname()))
            pairs.append((ours, stack.enter_context(server.accept()[0])))
        yield pairs


def _still_connected(pairs) -> bool:
    for ours, theirs in pairs:
        ours.sendall(b"?")
        theirs.settimeout(5)
        if theirs.recv(1) != b"?":
            return False
    return True


def test_a_gloo_shaped_loop_is_recognised_even_with_a_peer_already_reset():
    # A survivor that lost two peers: one of its pairs is reset, still registered; the live one must be hung up.
    with socket.create_server(("127.0.0.1", 0)) as server, contextlib.ExitStack() as stack:
        dead = stack.enter_context(_reset_by_peer(server))
        gloo = stack.enter_context(GlooLikeLoop(pairs=1, extra=(dead.fileno(),)))
        # Shaped otherwise: asyncio's wake-up socket pair, a listener: left alone.
        a, b = socket.socketpair()
        stack.enter_context(a), stack.enter_context(b)
        user_loop = stack.enter_context(select.epoll())
        for fd in (a.fileno(), server.fileno()):
            user_loop.register(fd, select.EPOLLIN)

        expected = sorted([*gloo.fds, dead.fileno()])
        assert gloo_hangup.gloo_sockets() == expected
        assert gloo_hangup.hang_up() == expected
        gloo.peers[0].settimeout(5)
        assert gloo.peers[0].recv(1) == b""  # the live pair's peer reads the end of the stream now


@contextlib.contextmanager
def _peers_talking(gloo: GlooLikeLoop, every: float = 0.02):
    """Every peer of ``gloo`` sends a byte each ``every`` seconds, as a live Horovod world's cycles do."""
    stop = threading.Event()

    def talk():
        while not stop.wait(every):
            for peer in gloo.peers:
                peer.sendall(b"c")

    thread = threading.Thread(target=talk, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


def test_after_a_failure_a_world_that_keeps_talking_is_not_hung_up():
    with GlooLikeLoop(pairs=2) as gloo, _peers_talking(gloo):
        assert gloo_hangup.hang_up_if_stalled(quiet=0.2, window=0.6) == []
        for pair, peer in zip(gloo.pairs, gloo.peers):
            pair.sendall(b"?")
            peer.settimeout(5)
            assert peer.recv(1) == b"?"  # still connected both ways


def test_after_a_failure_a_quiet_world_is_hung_up():
    with GlooLikeLoop(pairs=2) as gloo:
        with _peers_talking(gloo):
            time.sleep(0.1)
        assert gloo_hangup.quiet_for() < 0.2  # data until just now: the hang-up must wait for the quiet
        assert gloo_hangup.hang_up_if_stalled(quiet=0.2, window=5.0) == gloo.fds
        for peer in gloo.peers:
            peer.settimeout(5)
            assert peer.recv(1) == b""  # the end of the stream: the peer fails at once
    with GlooLikeLoop(pairs=0):
        assert gloo_hangup.hang_up_if_stalled(quiet=0.2, window=0.5) == []  # no Gloo connections: nothing to do


def test_a_python_loop_woken_by_a_pipe_watching_client_connections_is_left_alone():
    # A hand-written selectors loop and a Twisted-style select.epoll: Gloo's shape but for the registration.
    with _client_connections(4) as pairs, GlooLikeLoop() as gloo, contextlib.ExitStack() as stack:
        wake_r, wake_w = os.pipe()
        stack.callback(os.close, wake_r)
        stack.callback(os.close, wake_w)
        selector = stack.enter_context(selectors.EpollSelector())
        selector.register(wake_r, selectors.EVENT_READ)
        for ours, _ in pairs[:2]:
            selector.register(ours, selectors.EVENT_READ | selectors.EVENT_WRITE)
        reactor = stack.enter_context(select.epoll())
        reactor.register(wake_r, select.EPOLLIN)
        for ours, _ in pairs[2:]:
            reactor.register(ours.fileno(), select.EPOLLIN)

        assert gloo_hangup.gloo_sockets() == gloo.fds  # only the loop registered as Gloo registers
        assert gloo_hangup.hang_up() == gloo.fds
        assert _still_connected(pairs)


def test_looking_at_a_loop_with_a_descriptor_that_is_no_socket_leaves_nothing_open():
    event = os.eventfd(0)
    try:
        with GlooLikeLoop(extra=(event,)):  # an eventfd among TCP pairs: not Gloo's shape
            before = _open_fds()
            for _ in range(20):
                assert gloo_hangup.gloo_sockets() == []
            assert _open_fds() == before
    finally:
        os.close(event)


def test_a_descriptor_number_reused_after_the_listing_is_not_shut_down(monkeypatch):
    with GlooLikeLoop(pairs=1) as gloo, _client_connections(1) as pairs:
        user, _ = pairs[0]
        listed = gloo_hangup.gloo_endpoints()
        assert [e.fd for e in listed] == gloo.fds

        def listed_then_reused():
            # Between the listing and the shutdown Gloo closes the pair, and its number is reused for
            # (here: made to name) a connection of the user's.
            os.dup2(user.fileno(), gloo.fds[0])
            return listed

        monkeypatch.setattr(gloo_hangup, "gloo_endpoints", listed_then_reused)
        assert gloo_hangup.hang_up() == []
        assert _still_connected(pairs)


def test_a_missing_gloo_loop_is_one_warning_per_check(caplog):
    caplog.set_level(logging.INFO, logger=gloo_hangup.__name__)
    assert gloo_hangup.check_found() is False
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "HOROVOD_GLOO_TIMEOUT_SECONDS" in warnings[0].getMessage()
    caplog.clear()
    with GlooLikeLoop():
        assert gloo_hangup.check_found() is True
    assert caplog.records == []
