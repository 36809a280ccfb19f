"""A fresh interpreter for the fork-safety unit tests: at-fork hooks cannot be removed,
so every case that installs them runs here, never in pytest's own process.

    python forksafe_probe.py forks OUT [--die]
        install(), open TCP connections and a listener (plus a pipe and a unix socket
        pair), then fork four children: os.fork(), and multiprocessing "fork" Processes
        that are daemonic, non-daemonic, and daemonic but started from another thread.
        Each child writes OUT/<kind>.json: its pid and parent, the TCP descriptors it
        still holds, what its copies of the parent's TCP descriptors now are, and
        whether the unix socket pair still carries data.  Writes OUT/parent.json.
        With --die the children then sleep (at most 60 s) and the parent SIGKILLs itself.
    python forksafe_probe.py unsupported OUT
        the same without /proc (FD_DIR points nowhere): install() twice, one os.fork() child.
    python forksafe_probe.py preexec OUT
        subprocess with pass_fds=[a TCP socket] and a preexec_fn: the exec'd program's view.

``HVD_ELASTIC_FORK_SAFETY`` is passed on as the test sets it.  OUT/log.txt holds
every log record of the ``hvd_elastic`` loggers.
"""

import json
import logging
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from hvd_elastic.training import forksafe


def write(path, obj):
    with open(f"{path}.tmp", "w") as f:
        json.dump(obj, f)
    os.replace(f"{path}.tmp", path)


def open_descriptors():
    """A listener, both ends of a loopback connection, a pipe and a unix socket pair."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    return {"tcp": [listener, client, accepted], "pipe": os.pipe(), "unix": socket.socketpair()}


def child_report(out, kind, fds, die):
    left, right = fds["unix"]
    left.sendall(b"u")
    write(os.path.join(out, f"{kind}.json"), {
        "pid": os.getpid(), "parent": os.getppid(), "tcp": forksafe.tcp_socket_fds(),
        "inherited": {s.fileno(): os.readlink(f"/proc/self/fd/{s.fileno()}") for s in fds["tcp"]},
        "unix_ok": right.recv(1) == b"u",
        "pipe": [os.readlink(f"/proc/self/fd/{fd}") for fd in fds["pipe"]],
    })
    if die:
        time.sleep(60)


def forks(out, die):
    fds = open_descriptors()
    installed = forksafe.install()
    ctx = multiprocessing.get_context("fork")
    pid = os.fork()
    if pid == 0:
        try:
            child_report(out, "os_fork", fds, die)
        finally:
            os._exit(0)
    children = {"os_fork": pid}
    for kind, daemon in (("daemonic", True), ("non_daemonic", False)):
        proc = ctx.Process(target=child_report, args=(out, kind, fds, die), daemon=daemon)
        proc.start()
        children[kind] = proc.pid
    from_thread = {}

    def start_in_thread():
        proc = ctx.Process(target=child_report, args=(out, "daemonic_from_thread", fds, die), daemon=True)
        proc.start()
        from_thread["pid"] = proc.pid

    thread = threading.Thread(target=start_in_thread)
    thread.start()
    thread.join()
    children["daemonic_from_thread"] = from_thread["pid"]
    write(os.path.join(out, "parent.json"), {"pid": os.getpid(), "installed": installed, "children": children,
                                             "tcp": sorted(s.fileno() for s in fds["tcp"])})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(os.path.exists(os.path.join(out, f"{k}.json")) for k in children):
        time.sleep(0.02)
    if die:
        os.kill(os.getpid(), signal.SIGKILL)
    # The parent's own connection still works after every child released its copies.
    client, accepted = fds["tcp"][1], fds["tcp"][2]
    client.sendall(b"p")
    write(os.path.join(out, "parent_after.json"), {"connection_ok": accepted.recv(1) == b"p"})


def unsupported(out):
    fds = open_descriptors()
    forksafe.FD_DIR = os.path.join(out, "no-proc-here")
    results = [forksafe.install(), forksafe.install()]
    pid = os.fork()
    if pid == 0:
        try:
            forksafe.FD_DIR = "/proc/self/fd"  # to look, not to act
            write(os.path.join(out, "child.json"), {"tcp": forksafe.tcp_socket_fds()})
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    write(os.path.join(out, "parent.json"), {"installed": results, "tcp": sorted(s.fileno() for s in fds["tcp"])})


def preexec(out):
    fds = open_descriptors()
    installed = forksafe.install()
    fd = fds["tcp"][1].fileno()
    seen = subprocess.run([sys.executable, "-c", f"import os; print(os.readlink('/proc/self/fd/{fd}'))"],
                          pass_fds=[fd], preexec_fn=lambda: None, capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()
    write(os.path.join(out, "parent.json"), {"installed": installed, "before": os.readlink(f"/proc/self/fd/{fd}"),
                                             "exec_child_sees": seen})


def main():
    case, out = sys.argv[1], sys.argv[2]
    logging.basicConfig(filename=os.path.join(out, "log.txt"), level=logging.DEBUG,
                        format="%(levelname)s %(name)s %(message)s")
    if case == "forks":
        forks(out, die="--die" in sys.argv)
    elif case == "unsupported":
        unsupported(out)
    elif case == "preexec":
        preexec(out)
    else:
        raise SystemExit(f"unknown case {case!r}")


if __name__ == "__main__":
    main()
