"""A fresh interpreter for the fork-safety unit tests: at-fork hooks cannot be removed,
so every case that installs them runs here, never in pytest's own process.

Every case holds a Gloo-shaped loop (gloo_shapes.GlooLikeLoop: a wake-up pipe and two
loopback connections in a natively registered epoll) besides connections of its own.

    python forksafe_probe.py forks OUT [--die]
        install(), then fork four children one after another: os.fork(), and multiprocessing
        "fork" Processes that are daemonic, non-daemonic, and daemonic but started from
        another thread.  Each child, on connections it inherited: sends "ping" on a TCP
        connection of its own and reads the parent's "pong", accepts a connection on the
        inherited listener and sends "hello" on it.  It writes OUT/<kind>.json: its pid, the
        Gloo sockets it still holds, what its copies of the Gloo descriptors now are, the two
        exchanges' outcomes, whether the unix socket pair and the pipe still work, and its
        parent-death signal.  Writes OUT/parent.json and, after the children,
        OUT/parent_after.json (the parent's Gloo pairs and connections still work).
        With --die the children then sleep (at most 60 s) and the parent SIGKILLs itself.
    python forksafe_probe.py race OUT
        forks from two threads that interleave between forksafe's before-fork hook and the
        fork itself, both ways: OUT/main_while_thread_forks.json and
        OUT/thread_while_main_forks.json hold each daemonic child's parent-death signal.
    python forksafe_probe.py forking_server OUT
        a socketserver.ForkingTCPServer echo handler: OUT/handler.json (the Gloo sockets
        it holds) and OUT/parent.json (the echo the client got).
    python forksafe_probe.py unsupported OUT
        the same without /proc (FD_DIR points nowhere): install() twice, one os.fork() child.
    python forksafe_probe.py preexec OUT
        subprocess with pass_fds=[a Gloo socket] and a preexec_fn: the exec'd program's view.

``HVD_ELASTIC_FORK_SAFETY`` is passed on as the test sets it.  OUT/log.txt holds
every log record of the ``hvd_elastic`` loggers.
"""

import ctypes
import json
import logging
import multiprocessing
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time

from gloo_shapes import GlooLikeLoop
from hvd_elastic.training import settings
from hvd_elastic.training._internal import forksafe, gloo_hangup

_prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before any fork
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_PR_GET_PDEATHSIG = 2
TIMEOUT = 5.0



def install() -> bool:
    """As a job starts: the worker's settings read from the environment, then the hooks."""
    return forksafe.install(settings.from_environment().fork_safety)

def write(path, obj):
    with open(f"{path}.tmp", "w") as f:
        json.dump(obj, f)
    os.replace(f"{path}.tmp", path)


def death_signal() -> int:
    value = ctypes.c_int(-1)
    _prctl(_PR_GET_PDEATHSIG, ctypes.addressof(value), 0, 0, 0)
    return value.value


def links(fds):
    return {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in fds}


def outcome(action):
    """What ``action()`` returned, or the error it raised, as text."""
    try:
        return action().decode()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def child_report(out, kind, fds, die):
    conn = fds["mine"][kind]
    conn.settimeout(TIMEOUT)
    fds["listener"].settimeout(TIMEOUT)

    def ping():
        conn.sendall(b"ping")
        return conn.recv(4)

    def serve():
        accepted, _ = fds["listener"].accept()
        with accepted:
            accepted.sendall(b"hello")
        return b"sent"

    left, right = fds["unix"]
    left.sendall(b"u")
    os.write(fds["pipe"][1], b"p")
    write(os.path.join(out, f"{kind}.json"), {
        "pid": os.getpid(), "parent": os.getppid(),
        "gloo": gloo_hangup.gloo_sockets(), "gloo_links": links(fds["gloo"].fds),
        "own_connection": outcome(ping), "listener": outcome(serve),
        "unix_ok": right.recv(1) == b"u", "pipe_ok": os.read(fds["pipe"][0], 1) == b"p",
        "death_signal": death_signal(),
    })
    if die:
        time.sleep(60)


def open_descriptors(kinds=()):
    """A Gloo-shaped loop, a listener, one loopback connection per child kind, a pipe and a unix pair."""
    listener = socket.create_server(("127.0.0.1", 0))
    mine, theirs = {}, {}
    for kind in kinds:
        mine[kind] = socket.create_connection(listener.getsockname())
        theirs[kind] = listener.accept()[0]
        theirs[kind].settimeout(TIMEOUT)
    return {"gloo": GlooLikeLoop(), "listener": listener, "mine": mine, "theirs": theirs,
            "pipe": os.pipe(), "unix": socket.socketpair()}


def answer(fds, kind):
    """The parent's side of a child's two exchanges."""
    try:
        if fds["theirs"][kind].recv(4) == b"ping":
            fds["theirs"][kind].sendall(b"pong")
        with socket.create_connection(fds["listener"].getsockname(), timeout=TIMEOUT) as c:
            c.recv(5)
    except OSError:
        pass  # the child reports what it saw


def wait_for(path):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not os.path.exists(path):
        time.sleep(0.02)


def forks(out, die):
    kinds = ("os_fork", "daemonic", "non_daemonic", "daemonic_from_thread")
    fds = open_descriptors(kinds)
    installed = install()
    ctx = multiprocessing.get_context("fork")
    children = {}
    for kind in kinds:
        if kind == "os_fork":
            pid = os.fork()
            if pid == 0:
                try:
                    child_report(out, kind, fds, die)
                finally:
                    os._exit(0)
            children[kind] = pid
        else:
            proc = ctx.Process(target=child_report, args=(out, kind, fds, die), daemon=kind != "non_daemonic")
            if kind == "daemonic_from_thread":
                thread = threading.Thread(target=proc.start)
                thread.start()
                thread.join()
            else:
                proc.start()
            children[kind] = proc.pid
        answer(fds, kind)
        wait_for(os.path.join(out, f"{kind}.json"))
    write(os.path.join(out, "parent.json"), {"pid": os.getpid(), "installed": installed, "children": children,
                                             "gloo": fds["gloo"].fds})
    if die:
        os.kill(os.getpid(), signal.SIGKILL)
    gloo = fds["gloo"]
    gloo.pairs[0].sendall(b"g")
    kind = kinds[0]
    fds["mine"][kind].sendall(b"m")
    write(os.path.join(out, "parent_after.json"), {"gloo_ok": gloo.peers[0].recv(1) == b"g",
                                                   "connection_ok": fds["theirs"][kind].recv(1) == b"m"})


def race(out):
    """See the module docstring; the interleaving is forced by a hook that runs after forksafe's."""
    ctx = multiprocessing.get_context("fork")
    main_may_fork, main_forked = threading.Event(), threading.Event()
    plan = {"during_main": False, "during_thread": False}

    def bare_fork():
        if os.fork() == 0:
            os._exit(0)

    def interleave():
        if plan["during_main"] and threading.current_thread() is threading.main_thread():
            plan["during_main"] = False
            thread = threading.Thread(target=bare_fork)  # its before-fork hooks run now
            thread.start()
            thread.join()
        elif plan["during_thread"] and threading.current_thread() is not threading.main_thread():
            plan["during_thread"] = False
            main_may_fork.set()
            main_forked.wait(TIMEOUT)  # releases the GIL: the main thread forks meanwhile

    # Before-fork hooks run in reverse order of registration: this one runs after forksafe's.
    os.register_at_fork(before=interleave)
    install()

    def report(name):
        write(os.path.join(out, f"{name}.json"), {"death_signal": death_signal()})

    plan["during_main"] = True
    proc = ctx.Process(target=report, args=("main_while_thread_forks",), daemon=True)
    proc.start()
    proc.join(TIMEOUT)

    plan["during_thread"] = True
    proc = ctx.Process(target=report, args=("thread_while_main_forks",), daemon=True)
    thread = threading.Thread(target=proc.start)
    thread.start()
    main_may_fork.wait(TIMEOUT)
    bare_fork()
    main_forked.set()
    thread.join()
    proc.join(TIMEOUT)
    for _ in range(2):
        os.wait()  # the bare forks


def forking_server(out):
    fds = open_descriptors()
    install()

    class Echo(socketserver.BaseRequestHandler):
        def handle(self):
            write(os.path.join(out, "handler.json"), {"gloo": gloo_hangup.gloo_sockets(),
                                                      "gloo_links": links(fds["gloo"].fds)})
            self.request.sendall(self.request.recv(64).upper())

    with socketserver.ForkingTCPServer(("127.0.0.1", 0), Echo) as server:
        server.timeout = TIMEOUT
        serving = threading.Thread(target=server.handle_request)
        serving.start()
        with socket.create_connection(server.server_address, timeout=TIMEOUT) as client:
            client.sendall(b"echo me")
            reply = outcome(lambda: client.recv(64))
        serving.join()
    write(os.path.join(out, "parent.json"), {"reply": reply})


def unsupported(out):
    fds = open_descriptors()
    forksafe.FD_DIR = os.path.join(out, "no-proc-here")
    results = [install(), install()]
    pid = os.fork()
    if pid == 0:
        try:
            write(os.path.join(out, "child.json"), {"gloo": gloo_hangup.gloo_sockets()})
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    write(os.path.join(out, "parent.json"), {"installed": results, "gloo": fds["gloo"].fds})


def preexec(out):
    fds = open_descriptors()
    installed = install()
    fd = fds["gloo"].fds[0]
    seen = subprocess.run([sys.executable, "-c", f"import os; print(os.readlink('/proc/self/fd/{fd}'))"],
                          pass_fds=[fd], preexec_fn=lambda: None, capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()
    write(os.path.join(out, "parent.json"), {"installed": installed, "before": os.readlink(f"/proc/self/fd/{fd}"),
                                             "exec_child_sees": seen})


def main():
    case, out = sys.argv[1], sys.argv[2]
    logging.basicConfig(filename=os.path.join(out, "log.txt"), level=logging.DEBUG,
                        format="%(levelname)s %(name)s %(message)s")
    cases = {"forks": lambda: forks(out, die="--die" in sys.argv), "race": lambda: race(out),
             "forking_server": lambda: forking_server(out), "unsupported": lambda: unsupported(out),
             "preexec": lambda: preexec(out)}
    if case not in cases:
        raise SystemExit(f"unknown case {case!r}")
    cases[case]()


if __name__ == "__main__":
    main()
