"""The standby: import the heavy modules once, then fork workers on request (``hvd-elastic standby``).

One standby serves one job's workers on one host (its name, :mod:`.protocol`).
It imports ``torch`` (with ``torch._dynamo``, which building an optimizer
would import), ``horovod.torch``, hvd-elastic's training API and ``--preload``
modules, then binds
its socket: a socket that answers is a standby that is ready.  It never
initialises CUDA or Horovod and runs no threads of its own, so a fork of it is
a clean start (:mod:`.child` lists what the child drops).

One thread, one ``select`` loop over the listener, each launcher's connection
and each worker's pidfd:

* a connection from another user is refused (``SO_PEERCRED``; the directory
  and socket modes already keep others out);
* a request forks a worker at once and answers its pid; the worker's wait
  status goes back when it ends;
* a launcher that goes away (its connection closes) takes its worker with it:
  SIGTERM to the worker's process group, SIGKILL after :data:`KILL_GRACE`;
* stale code: before each fork the files of every imported module are checked;
  if one changed since the start, the request is refused (the launcher starts
  the worker directly) and the standby re-executes itself once no worker of
  its own runs, so it never forks old code.

SIGTERM or SIGINT: the socket goes at once (new workers start directly), and the
standby exits when the workers it forked have ended; a second one terminates them.
Under systemd (``Type=notify``, ``scripts/systemd/hvd-elastic-standby@.service``)
it reports ``READY=1`` once its socket answers and ``STOPPING=1`` at the first
stop signal (:mod:`hvd_elastic.sdnotify`).
Exit codes: 0 after a stop, 1 when it cannot start (a preload fails, the socket
is taken), 2 for bad input.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import logging
import os
import selectors
import signal
import socket
import stat
import sys
import time
from typing import Any

import hvd_elastic
from hvd_elastic import sdnotify
from hvd_elastic.errors import HvdElasticError
from hvd_elastic.standby import child, protocol

log = logging.getLogger(__name__)

# torch._dynamo too: torch.optim imports it lazily when an optimizer is built
# (about 800 modules, seconds), which a joining worker would otherwise pay while
# the survivors wait for it.  And hvd-elastic's training API (what ``hvd_elastic.run``
# and its states import, about 50 modules), which a worker would import after the fork.
BASE_MODULES = ("torch", "torch._dynamo", "horovod.torch", *sorted(set(hvd_elastic._LAZY.values())))
KILL_GRACE = 10.0  # seconds between SIGTERM and SIGKILL of an abandoned worker
TICK = 0.5  # seconds: how often the loop looks at signals and deadlines


class StandbyError(HvdElasticError, RuntimeError):
    """The standby cannot start (one line, names what is wrong)."""


@dataclasses.dataclass
class _Launcher:
    """One launcher's connection, and the worker it asked for once there is one."""

    sock: socket.socket
    pid: int | None = None
    pidfd: int | None = None
    kill_at: float | None = None  # SIGKILL the worker at this monotonic time

    @property
    def worker_pid(self) -> int:
        """``pid``, asked only of a launcher whose worker was forked."""
        if self.pid is None:
            raise RuntimeError("this launcher's worker was never forked")
        return self.pid


class Standby:
    def __init__(self, name: str, preload: list[str]):
        self.name = name
        self.path = protocol.socket_path(name)
        self.preload = [*BASE_MODULES, *(m for m in preload if m not in BASE_MODULES)]
        self.fingerprint = protocol.fingerprint()
        self._files: dict[str, int] = {}
        self._listener: socket.socket | None = None
        self._selector = selectors.DefaultSelector()
        self._launchers: dict[int, _Launcher] = {}  # by connection fd
        self._workers: dict[int, _Launcher] = {}  # by pidfd
        self._stops = 0
        self.stale = False

    # ----------------------------------------------------------- start-up

    def prepare(self) -> float:
        """Import the modules and bind the socket; seconds the imports took."""
        started = time.monotonic()
        for module in self.preload:
            try:
                importlib.import_module(module)
            except Exception as exc:  # noqa: BLE001 -- any import failure is the user's to see, in one line
                raise StandbyError(f"cannot preload {module!r}: {type(exc).__name__}: {exc}") from None
        took = time.monotonic() - started
        # Into the permanent generation: the workers' collections never walk (and so
        # never copy-on-write) the standby's objects; a worker's exit is ~3x faster.
        gc.collect()
        gc.freeze()
        self._files = _module_files()
        self._listener = self._bind()
        self._selector.register(self._listener, selectors.EVENT_READ)
        return took

    def _bind(self) -> socket.socket:
        directory = self.path.parent
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = directory.stat()
        if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
            raise StandbyError(f"socket directory {directory} must belong to uid {os.getuid()} with mode 0700 "
                               f"(it is uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o})")
        if self.path.exists():
            try:
                protocol.connect(self.name, timeout=1.0)[0].close()
            except OSError:
                self.path.unlink()  # a socket a killed standby left
            else:
                raise StandbyError(f"a standby {self.name!r} already answers at {self.path}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        old_umask = os.umask(0o177)  # never a moment with a socket others may connect to
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old_umask)
        sock.listen(64)
        sock.setblocking(False)
        return sock

    # ---------------------------------------------------------------- loop

    def serve(self) -> tuple[dict, list[int]] | None:
        """Serve until stopped (returns None), or, in a forked child, return its (request, stdio fds)."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_stop)
        while self._listener is not None or self._workers:
            for key, _ in self._selector.select(TICK):
                task = self._dispatch(key.fileobj)
                if task is not None:
                    return task
            self._kill_overdue()
            if self.stale and not self._workers and self._listener is not None:
                self._reexec()
        return None

    def _on_stop(self, signum, _frame) -> None:
        self._stops += 1
        if self._stops == 1:
            sdnotify.notify("STOPPING=1")
        if self._listener is not None:
            log.info("standby %r stopping (%s): no new workers; %d running", self.name,
                     signal.Signals(signum).name, len(self._workers))
            self._close_listener()
        if self._stops > 1:
            for launcher in self._workers.values():
                self._terminate(launcher)

    def _dispatch(self, obj) -> tuple[dict, list[int]] | None:
        # A stop signal may close the listener between select() and here: what is no longer ours is skipped.
        if isinstance(obj, int):
            if obj in self._workers:
                self._reap(obj)
        elif self._listener is not None and obj is self._listener:
            self._accept(self._listener)
        elif obj.fileno() in self._launchers:
            return self._read(self._launchers[obj.fileno()])
        return None

    def _accept(self, listener: socket.socket) -> None:
        try:
            sock, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        pid, uid, _ = _peer_credentials(sock)
        if uid != os.getuid():
            log.warning("standby %r refused a connection from uid %d (pid %d)", self.name, uid, pid)
            _send_quietly(sock, {"refused": f"this standby serves uid {os.getuid()} only"})
            sock.close()
            return
        sock.setblocking(True)
        sock.settimeout(1.0)  # our answers are a few hundred bytes: never block the loop long
        if not _send_quietly(sock, {"hello": self.fingerprint, "python": sys.executable, "pid": os.getpid(),
                                         "netns": protocol.network_namespace()}):
            sock.close()
            return
        self._launchers[sock.fileno()] = _Launcher(sock)
        self._selector.register(sock, selectors.EVENT_READ)

    def _read(self, launcher: _Launcher) -> tuple[dict, list[int]] | None:
        try:
            message, fds = protocol.receive(launcher.sock, max_fds=protocol.STDIO_FDS)
        except (OSError, protocol.ProtocolError) as exc:
            log.warning("standby %r: bad message from a launcher (%s)", self.name, exc)
            message, fds = None, []
        if launcher.pid is not None:  # its worker runs: anything but a close is noise
            for fd in fds:
                os.close(fd)
            if message is None:
                self._drop(launcher)
                self._terminate(launcher)
            return None
        if message is None:
            self._drop(launcher)
            launcher.sock.close()
            return None
        return self._start(launcher, message, fds)

    def _start(self, launcher: _Launcher, message: dict, fds: list[int]) -> tuple[dict, list[int]] | None:
        request: Any = message.get("run")  # a launcher's, untrusted: _check_request vets it before any use
        refusal = _check_request(request, fds) or self._check_fresh()
        if refusal is None and self._listener is None:
            refusal = "the standby is stopping"
        if refusal is not None:
            for fd in fds:
                os.close(fd)
            log.info("standby %r refused a worker: %s", self.name, refusal)
            _send_quietly(launcher.sock, {"refused": refusal})
            self._drop(launcher)
            launcher.sock.close()
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._close_all()
            child.become_worker(request, fds)
            return request, fds
        try:
            # also done in the child: whichever runs first, the group exists before the pid is sent
            os.setpgid(pid, pid)
        except (PermissionError, ProcessLookupError):
            pass  # the child already exec'd or exited: its own setpgid ran
        launcher.pid = pid
        launcher.pidfd = os.pidfd_open(pid)
        self._workers[launcher.pidfd] = launcher
        self._selector.register(launcher.pidfd, selectors.EVENT_READ)
        for fd in fds:
            os.close(fd)
        log.info("standby %r forked worker %d: %s", self.name, pid, " ".join(request["argv"])[:200])
        if not _send_quietly(launcher.sock, {"pid": pid}):
            self._drop(launcher)
            self._terminate(launcher)
        return None

    def _check_fresh(self) -> str | None:
        changed = _changed_file(self._files)
        if changed is None:
            return None
        if not self.stale:
            log.warning("standby %r is stale: %s changed since it started; it restarts once its workers end",
                        self.name, changed)
        self.stale = True
        return f"stale: {changed} changed since the standby started"

    def _reap(self, pidfd: int) -> None:
        launcher = self._workers.pop(pidfd)
        self._selector.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(launcher.worker_pid, 0)
        outcome = ({"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status)
                   else {"exit": os.waitstatus_to_exitcode(status)})
        log.info("standby %r: worker %d ended (%s)", self.name, launcher.pid, outcome)
        if launcher.sock.fileno() in self._launchers:
            _send_quietly(launcher.sock, outcome)
            self._drop(launcher)
        launcher.sock.close()

    # ---------------------------------------------------- worker endings

    def _terminate(self, launcher: _Launcher) -> None:
        if launcher.kill_at is None:
            _signal_group(launcher.worker_pid, signal.SIGTERM)
            launcher.kill_at = time.monotonic() + KILL_GRACE

    def _kill_overdue(self) -> None:
        now = time.monotonic()
        for launcher in self._workers.values():
            if launcher.kill_at is not None and now >= launcher.kill_at:
                _signal_group(launcher.worker_pid, signal.SIGKILL)
                launcher.kill_at = float("inf")

    # ------------------------------------------------------------ plumbing

    def _drop(self, launcher: _Launcher) -> None:
        if self._launchers.pop(launcher.sock.fileno(), None) is not None:
            self._selector.unregister(launcher.sock)

    def _close_listener(self) -> None:
        if self._listener is None:  # closed already
            return
        self._selector.unregister(self._listener)
        self._listener.close()
        self._listener = None
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def _close_all(self) -> None:
        """In the child: nothing of the standby's sockets, pidfds or selector stays open."""
        if self._listener is not None:
            self._listener.close()
        for launcher in self._launchers.values():
            launcher.sock.close()
        for pidfd in self._workers:
            os.close(pidfd)
        self._selector.close()

    def _reexec(self) -> None:
        log.info("standby %r restarting to load the changed code", self.name)
        self._close_listener()
        logging.shutdown()
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])

    def close(self) -> None:
        if self._listener is not None:
            self._close_listener()


def _check_request(request, fds: list[int]) -> str | None:
    if not isinstance(request, dict):
        return "no run request"
    argv, environ, cwd = request.get("argv"), request.get("env"), request.get("cwd")
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        return "argv must be a non-empty list of strings"
    if not (isinstance(environ, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in environ.items())):
        return "env must map strings to strings"
    if not (isinstance(cwd, str) and os.path.isdir(cwd)):
        return f"working directory {cwd!r} does not exist here"
    if len(fds) != protocol.STDIO_FDS:
        return f"expected {protocol.STDIO_FDS} stdio descriptors, got {len(fds)}"
    return None


def _module_files() -> dict[str, int]:
    files = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path:
            try:
                files[path] = os.stat(path).st_mtime_ns
            except OSError:
                pass
    return files


def _changed_file(files: dict[str, int]) -> str | None:
    for path, mtime in files.items():
        try:
            if os.stat(path).st_mtime_ns != mtime:
                return path
        except OSError:
            return path
    return None


def _peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    import struct

    return struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))


def _send_quietly(sock: socket.socket, message: dict) -> bool:
    try:
        protocol.send(sock, message)
        return True
    except OSError:
        return False


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


# ------------------------------------------------------------------ CLI
