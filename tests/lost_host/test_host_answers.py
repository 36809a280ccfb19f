"""The reaper's check that a lost host no longer answers (hvd_elastic.discovery.host_answers), on real sockets.

An "sshd" is a loopback listener that greets like one, or one whose process
accepts nothing (a frozen sshd: the kernel completes the handshake, no one
speaks).  An "ssh client" is this interpreter started through a link named
``ssh`` in its own session, holding a connection to such a listener, as
horovodrun's sessions do.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from hvd_elastic.discovery import host_answers
from testbed import wait_until


@pytest.fixture
def listener():
    """A loopback listener; ``greet`` says whether it greets each connection like sshd."""
    sock = socket.create_server(("127.0.0.1", 0))
    state = {"greet": True, "stop": False, "conns": []}

    def serve():
        while not state["stop"]:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            state["conns"].append(conn)
            if state["greet"]:
                conn.sendall(b"SSH-2.0-OpenSSH_test\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1], state
    finally:
        state["stop"] = True
        sock.close()
        for conn in state["conns"]:
            conn.close()


@pytest.fixture
def silent_port():
    """A listening socket nobody accepts on: the kernel completes handshakes into its backlog."""
    sock = socket.create_server(("127.0.0.1", 0))
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


@pytest.fixture
def session(tmp_path):
    """Start ``argv`` in its own session (argv[0] may be a link name); yield a starter, kill all on exit."""
    procs = []

    def start(*argv: str) -> subprocess.Popen:
        proc = subprocess.Popen(list(argv), start_new_session=True, stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()


def ssh_link(tmp_path) -> str:
    """This interpreter under the name ``ssh``: its processes' comm is "ssh"."""
    link = tmp_path / "ssh"
    if not link.exists():
        link.symlink_to(sys.executable)
    return str(link)


def fake_ssh(tmp_path, start, port: int) -> subprocess.Popen:
    code = (f"import socket, time; s = socket.create_connection(('127.0.0.1', {port})); print('up', flush=True); "
            "time.sleep(60)")
    proc = start(ssh_link(tmp_path), "-c", code)
    assert proc.stdout.readline().strip() == "up"
    assert psutil.Process(proc.pid).name() == "ssh", "the probe knows an ssh client by its name"
    return proc


def test_sshd_greets_only_when_something_speaks_ssh(listener, silent_port):
    port, state = listener
    assert host_answers.sshd_greets("127.0.0.1", port, timeout=2.0) is True
    state["greet"] = False
    began = time.monotonic()
    assert host_answers.sshd_greets("127.0.0.1", port, timeout=0.5) is False
    assert host_answers.sshd_greets("127.0.0.1", silent_port, timeout=0.5) is False
    assert time.monotonic() - began < 5, "a silent peer costs the timeout, not more"
    free = socket.create_server(("127.0.0.1", 0))
    closed = free.getsockname()[1]
    free.close()
    assert host_answers.sshd_greets("127.0.0.1", closed, timeout=0.5) is False, "refused"


def test_a_remote_session_answers_while_the_sshd_its_client_reached_greets(tmp_path, session, listener):
    port, state = listener
    proc = fake_ssh(tmp_path, session, port)
    alive, how = host_answers.answers([proc.pid])
    assert alive is True and how == f"its sshd at 127.0.0.1:{port} greeted"
    state["greet"] = False  # the client's own connection stays up: a frozen host holds its sockets
    alive, how = host_answers.answers([proc.pid])
    assert alive is False and "did not greet" in how


def test_a_local_session_answers_while_a_worker_runs(session):
    shell = session("/bin/sh", "-c", "sleep 60 & sleep 60 & echo up; wait")
    assert shell.stdout.readline().strip() == "up"
    workers = wait_until("two workers", lambda: len(c := psutil.Process(shell.pid).children()) == 2 and c, 10)
    assert host_answers.answers([shell.pid]) == (True, "its workers on this machine run")
    workers[0].send_signal(signal.SIGSTOP)
    assert host_answers.answers([shell.pid])[0] is True, "one worker still runs"
    workers[1].send_signal(signal.SIGSTOP)
    wait_until("both stopped", lambda: all(w.status() == psutil.STATUS_STOPPED for w in workers), 10)
    assert host_answers.answers([shell.pid]) == (False, "its workers on this machine are stopped or gone")


def test_the_reaper_and_its_check_import_without_site_packages():
    # The discovery watcher that runs them starts as `python3 -I -S` (discovery/consul_hosts): stdlib only.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = (f"import sys; sys.path.insert(0, {root!r}); from hvd_elastic.discovery import reaper, host_answers; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('psutil', 'torch', 'horovod')))")
    result = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr


def test_an_ssh_client_without_a_connection_of_its_own_does_not_answer(tmp_path, session):
    # A ControlMaster's mux client or a ProxyCommand's: no TCP connection to probe.
    proc = session(ssh_link(tmp_path), "-c", "print('up', flush=True); import time; time.sleep(60)")
    assert proc.stdout.readline().strip() == "up"
    assert host_answers.answers([proc.pid]) == (False, "its ssh client holds no established connection of its own "
                                                       "to probe")


def test_a_proxyjump_clients_connection_to_the_jump_host_is_not_taken_for_the_host(tmp_path, session, listener):
    port, _ = listener  # the jump host's sshd greets; the host behind it is not asked
    link = ssh_link(tmp_path)
    jump = (f"import socket, time; s = socket.create_connection(('127.0.0.1', {port})); print('up', flush=True); "
            "time.sleep(60)")
    code = (f"import subprocess, sys; p = subprocess.Popen([{link!r}, '-c', {jump!r}], stdout=subprocess.PIPE, "
            "text=True); print(p.stdout.readline().strip(), flush=True); p.wait()")
    proc = session(link, "-c", code)
    assert proc.stdout.readline().strip() == "up"
    alive, how = host_answers.answers([proc.pid])
    assert alive is False and "no established connection of its own" in how
