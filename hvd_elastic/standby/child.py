"""The forked child: turn a copy of the standby into the worker the launcher asked for.

What the child must not keep from the standby, and why:

* its sockets: the listener and every other launcher's connection (closed by
  the server before :func:`become_worker`), so a worker never holds another
  worker's standby connection open;
* its stdio, environment, working directory, ``sys.argv`` and ``sys.path[0]``:
  replaced by the launcher's, so the script sees what a direct start would;
* its signal handlers and logging handlers: back to an interpreter's defaults;
* its random state: Python's ``random`` reseeds itself at fork; numpy's legacy
  global generator, if imported, is reseeded here (each child would otherwise
  draw the same numbers).

What stays the standby's, and who stands in for the worker there: the
process's ``/proc/PID/cmdline`` and ``/proc/PID/environ`` (the kernel's copies
from the standby's own start).  The launcher (``hvd-elastic exec``) is a real
process with horovodrun's command line and environment that lives exactly as
long as its worker, so what reads the process table
(:func:`hvd_elastic.nodeagent.leave.local_workers`, ``drain --wait``) still
finds the job on this node.

What the standby must not have done for this to be safe: initialise CUDA or
Horovod, or start threads of its own (:mod:`.server` only imports modules).
Environment variables that preloaded modules read at import time are the
standby's: start it with the job's environment.

The worker runs as ``__main__`` through :mod:`runpy` and then leaves through the
normal interpreter exit (atexit handlers, non-daemon threads, buffered output),
as a directly started script would.
"""

from __future__ import annotations

import io
import logging
import os
import runpy
import signal
import sys
import traceback

RESET_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD,
                 signal.SIGPIPE)


def become_worker(request: dict, stdio: list[int]) -> None:
    """In the freshly forked child: take the launcher's process context (see the module docstring)."""
    os.setpgid(0, 0)  # the launcher forwards signals to this group, as a shell does to a job
    for target, fd in enumerate(stdio):
        if fd != target:
            os.dup2(fd, target)
            os.close(fd)
    for signum in RESET_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as the interpreter sets it at start
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    unbuffered = request.get("unbuffered") or bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=unbuffered,
                                  line_buffering=os.isatty(1))
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=unbuffered,
                                  line_buffering=True, errors="backslashreplace")
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def run_worker(request: dict) -> int:
    """Run the requested script or module as ``__main__``; its exit code (never returns from a crash silently)."""
    argv = request["argv"]
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]  # runpy sets argv[0] to the module's file
            sys.path.insert(0, os.getcwd())
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        return _exit_code(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        return 128 + signal.SIGINT
    except BaseException as exc:  # noqa: BLE001 -- report it as the interpreter would, without our frames
        traceback.print_exception(type(exc), exc, _user_frames(exc.__traceback__))
        return 1
    return 0


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _user_frames(tb):
    # Drop the frames of this module and runpy, so the traceback starts in the user's code.
    while tb is not None and tb.tb_frame.f_globals.get("__name__") in (__name__, "runpy"):
        tb = tb.tb_next
    return tb
