"""hvd_elastic.training._internal.forksafe without Horovod: a forked child releases the Gloo connections
and keeps its own, which children die with their parent, the off switch and the unsupported platform.

Gloo's loop is stood in for by gloo_shapes.GlooLikeLoop (real loopback connections in an epoll
registered as Gloo's C++ code registers its own).  Cases that install the at-fork hooks run in a
fresh interpreter (forksafe_probe.py): hooks cannot be removed, and pytest's process must not
carry them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil

from gloo_shapes import GlooLikeLoop
from hvd_elastic.consul.config import ConfigError
from testbed import child_env
from testbed.procs import is_alive, wait_dead
from hvd_elastic.training._internal import forksafe

HERE = Path(__file__).parent
PROBE = HERE / "forksafe_probe.py"
CHILDREN = ("os_fork", "daemonic", "non_daemonic", "daemonic_from_thread")


def test_a_forked_child_releases_the_gloo_connections_and_its_own_connection_still_works():
    with GlooLikeLoop() as gloo, socket.create_server(("127.0.0.1", 0)) as listener:
        mine = socket.create_connection(listener.getsockname())
        theirs, _ = listener.accept()
        report_r, report_w = os.pipe()
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: release, use its own connection, then live on until the parent is done
            try:
                # Where an earlier test in this process installed the at-fork hook (TrainingState does),
                # it has already released them before this line: count those too.
                released = sorted(set(forksafe.release_gloo_sockets())
                                  | {fd for fd in gloo.fds if os.readlink(f"/proc/self/fd/{fd}") == os.devnull})
                mine.settimeout(30)
                mine.sendall(b"ping")
                reply = mine.recv(4).decode()
                report = {"released": released, "reply": reply,
                          "links": {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in gloo.fds}}
                os.write(report_w, json.dumps(report).encode() + b"\n")
                os.read(go_r, 1)
            finally:
                os._exit(0)
        try:
            theirs.settimeout(30)
            assert theirs.recv(4) == b"ping"  # the child's send arrived...
            theirs.sendall(b"pong")
            with os.fdopen(report_r, closefd=False) as f:
                report = json.loads(f.readline())
            assert report["reply"] == "pong"  # ...and it received on its inherited connection
            assert report["released"] == gloo.fds
            assert set(report["links"].values()) == {os.devnull}  # the numbers stay taken
            # The parent's Gloo connections are intact...
            gloo.pairs[0].sendall(b"x")
            assert gloo.peers[0].recv(1) == b"x"
            # ...and closing the parent's end reaches the peer while the child lives on.
            gloo.pairs[1].close()
            gloo.peers[1].settimeout(30)
            assert gloo.peers[1].recv(1) == b"", "the child still holds the Gloo connection"
            assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        finally:
            os.write(go_w, b"g")
            os.waitpid(pid, 0)
            for fd in (report_r, report_w, go_r, go_w):
                os.close(fd)
            mine.close()
            theirs.close()


def probe(tmp_path: Path, case: str, *args: str, fork_safety: str | None = None) -> dict:
    """Run a forksafe_probe.py case; return OUT's JSON files by name, and the log."""
    extra = {} if fork_safety is None else {forksafe.ENV: fork_safety}
    # Output to a file, not a pipe: children that outlive the probe would hold a pipe open.
    with open(tmp_path / "output.txt", "w") as output:
        result = subprocess.run([sys.executable, str(PROBE), case, str(tmp_path), *args], env=child_env(**extra),
                                stdout=output, stderr=subprocess.STDOUT, timeout=120)
    files = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    files["log"] = (tmp_path / "log.txt").read_text() if (tmp_path / "log.txt").exists() else ""
    files["returncode"] = result.returncode
    files["stderr"] = (tmp_path / "output.txt").read_text()
    return files


def test_every_python_fork_releases_only_the_gloo_connections(tmp_path):
    out = probe(tmp_path, "forks")
    assert out["returncode"] == 0, out["stderr"]
    assert out["parent"]["installed"] is True
    for kind in CHILDREN:
        child = out[kind]
        assert child["gloo"] == [], kind
        assert set(child["gloo_links"].values()) == {os.devnull}, kind
        # Everything else it inherited works: its own connection both ways, the listener, pipes, unix sockets.
        assert child["own_connection"] == "pong", (kind, child["own_connection"])
        assert child["listener"] == "sent", (kind, child["listener"])
        assert child["unix_ok"] and child["pipe_ok"], kind
    assert out["parent_after"] == {"gloo_ok": True, "connection_ok": True}


def test_a_forking_server_s_handler_keeps_its_connection(tmp_path):
    out = probe(tmp_path, "forking_server")
    assert out["returncode"] == 0, out["stderr"]
    assert out["handler"]["gloo"] == [] and set(out["handler"]["gloo_links"].values()) == {os.devnull}
    assert out["parent"]["reply"] == "ECHO ME"


def test_only_daemonic_multiprocessing_children_of_the_main_thread_die_with_their_parent(tmp_path):
    out = probe(tmp_path, "forks", "--die")
    pids = out["parent"]["children"]
    procs = {kind: psutil.Process(pid) for kind, pid in pids.items() if psutil.pid_exists(pid)}
    try:
        assert out["returncode"] == -signal.SIGKILL, out["stderr"]
        assert {kind: out[kind]["death_signal"] for kind in CHILDREN} == {
            "daemonic": signal.SIGKILL, "os_fork": 0, "non_daemonic": 0, "daemonic_from_thread": 0}
        assert wait_dead(procs.get("daemonic"), timeout=20), "the daemonic child outlived its SIGKILLed parent"
        for kind in ("os_fork", "non_daemonic", "daemonic_from_thread"):
            assert kind in procs and is_alive(procs[kind]), f"the {kind} child died with its parent"
    finally:
        for proc in procs.values():
            if is_alive(proc):
                proc.kill()


def test_which_thread_forked_is_not_confused_by_a_fork_in_another_thread(tmp_path):
    out = probe(tmp_path, "race")
    assert out["returncode"] == 0, out["stderr"]
    assert out["main_while_thread_forks"]["death_signal"] == signal.SIGKILL
    assert out["thread_while_main_forks"]["death_signal"] == 0


def test_the_off_switch_leaves_children_their_sockets(tmp_path):
    out = probe(tmp_path, "forks", fork_safety="0")
    assert out["returncode"] == 0, out["stderr"]
    assert out["parent"]["installed"] is False
    for kind in ("os_fork", "daemonic"):
        assert out[kind]["gloo"] == out["parent"]["gloo"], kind
        assert out[kind]["death_signal"] == 0, kind
    assert "fork safety is off" in out["log"]


def test_a_bad_switch_value_is_an_error(tmp_path):
    out = probe(tmp_path, "forks", fork_safety="maybe")
    assert out["returncode"] != 0
    assert ConfigError.__name__ in out["stderr"] and forksafe.ENV in out["stderr"]


def test_without_proc_it_says_so_once_and_does_nothing(tmp_path):
    out = probe(tmp_path, "unsupported")
    assert out["returncode"] == 0, out["stderr"]
    assert out["parent"]["installed"] == [False, False]
    assert out["log"].count("fork safety is unavailable") == 1, out["log"]
    assert out["child"]["gloo"] == out["parent"]["gloo"]


def test_subprocess_children_keep_what_pass_fds_gives_them(tmp_path):
    out = probe(tmp_path, "preexec")
    assert out["returncode"] == 0, out["stderr"]
    assert out["parent"]["installed"] is True
    assert out["parent"]["exec_child_sees"] == out["parent"]["before"]
    assert out["parent"]["before"].startswith("socket:[")
