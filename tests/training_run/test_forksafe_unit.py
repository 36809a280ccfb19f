"""hvd_elastic.training.forksafe without Horovod: which descriptors a child releases, which
children die with their parent, the off switch and the unsupported platform.

Cases that install the at-fork hooks run in a fresh interpreter (forksafe_probe.py):
hooks cannot be removed, and pytest's process must not carry them.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from hvd_elastic.consul.config import ConfigError
from hvd_elastic.testbed import child_env
from hvd_elastic.training import forksafe

from hvd_elastic.testbed.procs import is_alive, wait_dead

HERE = Path(__file__).parent
PROBE = HERE / "forksafe_probe.py"
CHILDREN = ("os_fork", "daemonic", "non_daemonic", "daemonic_from_thread")


@pytest.fixture
def descriptors():
    """One of each kind the hook must tell apart, closed afterwards."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    tcp = {"listener": listener, "client": client, "accepted": accepted}
    if socket.has_ipv6:
        try:
            listener6 = socket.create_server(("::1", 0), family=socket.AF_INET6)
        except OSError:
            pass  # IPv6 configured off
        else:
            tcp["listener6"] = listener6
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    unix_left, unix_right = socket.socketpair()
    tcp["unconnected"] = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    pipe_r, pipe_w = os.pipe()
    file = open(__file__, "rb")
    event = os.eventfd(0)
    other = {"udp": udp.fileno(), "unix_left": unix_left.fileno(), "unix_right": unix_right.fileno(),
             "pipe_r": pipe_r, "pipe_w": pipe_w,
             "file": file.fileno(), "eventfd": event}
    yield tcp, other
    for s in (*tcp.values(), udp, unix_left, unix_right):
        s.close()
    for fd in (pipe_r, pipe_w, event):
        os.close(fd)
    file.close()


def test_selects_exactly_the_tcp_sockets(descriptors):
    tcp, other = descriptors
    found = set(forksafe.tcp_socket_fds())
    assert {s.fileno() for s in tcp.values()} <= found
    assert not found & set(other.values()), {k: v for k, v in other.items() if v in found}


def test_without_socket_names_the_tcp_tables_give_the_same_answer(descriptors, monkeypatch):
    tcp, other = descriptors
    named = set(forksafe.tcp_socket_fds())

    def unsupported(path, attribute):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported", path)

    monkeypatch.setattr(os, "getxattr", unsupported)
    listed = set(forksafe.tcp_socket_fds())
    # The tables list only bound or connected sockets: an unconnected one carries nothing.
    assert listed == named - {tcp["unconnected"].fileno()}


def test_a_forked_child_loses_only_its_tcp_sockets_and_the_parent_keeps_its_connection(descriptors):
    tcp, other = descriptors
    before = {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in other.values()}
    report_r, report_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: release, report, then live on until the parent is done
        try:
            # Where an earlier test in this process installed the at-fork hook (TrainingState does),
            # it has already released them before this line: count those too.
            released = sorted(set(forksafe.release_tcp_sockets())
                              | {s.fileno() for s in tcp.values() if os.readlink(f"/proc/self/fd/{s.fileno()}") == os.devnull})
            os.write(other["pipe_w"], b"p")
            tcp_left = forksafe.tcp_socket_fds()
            unix_ok = socket.socket(fileno=os.dup(other["unix_left"])).send(b"u") == 1
            report = {"released": released, "tcp_left": tcp_left, "unix_ok": unix_ok,
                      "links": {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in [*other.values(), *released]}}
            os.write(report_w, json.dumps(report).encode() + b"\n")
            os.read(go_r, 1)
        finally:
            os._exit(0)
    try:
        with os.fdopen(report_r, closefd=False) as f:
            report = json.loads(f.readline())
        assert {s.fileno() for s in tcp.values()} <= set(report["released"])
        assert not set(report["released"]) & set(other.values())
        assert report["tcp_left"] == []
        for fd in report["released"]:
            assert report["links"][str(fd)] == os.devnull  # the number stays taken
        assert {int(fd): link for fd, link in report["links"].items() if int(fd) in before} == before
        assert report["unix_ok"] and os.read(other["pipe_r"], 1) == b"p"
        assert socket.socket(fileno=os.dup(other["unix_right"])).recv(1) == b"u"
        # The parent's connection is intact...
        tcp["client"].sendall(b"x")
        assert tcp["accepted"].recv(1) == b"x"
        # ...and closing the parent's end reaches the peer while the child lives on.
        tcp["client"].close()
        tcp["accepted"].settimeout(30)
        assert tcp["accepted"].recv(1) == b"", "the child still holds the connection"
        assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    finally:
        os.write(go_w, b"g")
        os.waitpid(pid, 0)
        for fd in (report_r, report_w, go_r, go_w):
            os.close(fd)


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


def test_every_python_fork_releases_the_tcp_sockets_and_keeps_pipes_and_unix_sockets(tmp_path):
    out = probe(tmp_path, "forks")
    assert out["returncode"] == 0, out["stderr"]
    assert out["parent"]["installed"] is True
    for kind in CHILDREN:
        child = out[kind]
        assert child["tcp"] == [], kind
        assert set(child["inherited"].values()) == {os.devnull}, kind
        assert child["unix_ok"] and all(link.startswith("pipe:") for link in child["pipe"]), kind
    assert out["parent_after"]["connection_ok"]


def test_only_multiprocessing_children_of_the_main_thread_die_with_their_parent(tmp_path):
    out = probe(tmp_path, "forks", "--die")
    pids = out["parent"]["children"]
    procs = {kind: psutil.Process(pid) for kind, pid in pids.items() if psutil.pid_exists(pid)}
    try:
        assert out["returncode"] == -9, out["stderr"]
        for kind in ("daemonic", "non_daemonic"):
            assert wait_dead(procs.get(kind), timeout=20), f"the {kind} child outlived its SIGKILLed parent"
        for kind in ("os_fork", "daemonic_from_thread"):
            assert kind in procs and is_alive(procs[kind]), f"the {kind} child died with its parent"
    finally:
        for proc in procs.values():
            if is_alive(proc):
                proc.kill()


def test_the_off_switch_leaves_children_their_sockets(tmp_path):
    out = probe(tmp_path, "forks", fork_safety="0")
    assert out["returncode"] == 0, out["stderr"]
    assert out["parent"]["installed"] is False
    assert sorted(out["os_fork"]["tcp"]) == out["parent"]["tcp"]
    assert sorted(out["daemonic"]["tcp"]) == out["parent"]["tcp"]
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
    assert sorted(out["child"]["tcp"]) == out["parent"]["tcp"]


def test_subprocess_children_keep_what_pass_fds_gives_them(tmp_path):
    out = probe(tmp_path, "preexec")
    assert out["returncode"] == 0, out["stderr"]
    assert out["parent"]["installed"] is True
    assert out["parent"]["exec_child_sees"] == out["parent"]["before"]
    assert out["parent"]["before"].startswith("socket:[")
