"""Forked children of a training process never hold its TCP connections, nor outlive a crash.

Why
---
A DataLoader worker is forked from the training process after ``hvd.init()``,
so it inherits every descriptor, Horovod's Gloo sockets included.  When the
training process is killed (the OOM killer, a segfault, a scheduler's
SIGKILL) the kernel closes a connection only once its LAST descriptor is
gone: while an orphaned worker lives, the surviving ranks see no reset and
wait, until torch's worker notices its parent is gone (it polls every 5 s,
and never while stuck in ``__getitem__``) or until
``HOROVOD_GLOO_TIMEOUT_SECONDS``.  The orphan also shares the rank's stdout
and stderr, and horovodrun takes a rank for ended only when its output ends.

Contract
--------
:func:`install` registers ``os.register_at_fork`` hooks, once per process
(later calls return the first call's answer).  ``TrainingState`` and
:func:`hvd_elastic.run` call it; call it yourself before forking if you fork
before using either.  From then on, in every child of a Python-level fork
(``os.fork()``, multiprocessing's ``fork`` start method, so DataLoader and
StatefulDataLoader workers):

1. Every descriptor that is a TCP socket (``/proc/self/fd/N`` ->
   ``socket:[inode]`` whose protocol the kernel names TCP or TCPv6; see
   :func:`tcp_socket_fds`) is released: connected, listening or neither.
   Nothing else is touched: pipes, unix sockets (multiprocessing queues and
   the descriptor passing of shared-memory tensors), UDP sockets, files,
   eventfds and epoll descriptors stay as they are.  *Released* means
   ``/dev/null`` is ``dup2``-ed over the number: the child's reference to the
   connection is dropped, so the parent's death resets it at once, while the
   number stays taken, so an inherited Python or C++ object that still holds
   it fails (ENOTSOCK) instead of reading, writing or later closing an
   unrelated file that reuses the number.  Never ``shutdown()``: that would
   act on the connection the parent still uses.  The parent is untouched.
2. A multiprocessing child (the ``fork`` start method: DataLoader workers,
   daemonic or not) forked by the parent's *main thread* dies with the
   parent: ``PR_SET_PDEATHSIG`` with SIGKILL.  Why this scope:

   * releasing sockets is not enough: through the shared output, any child
     outliving a crashed rank holds up the job's recovery.  At a clean exit multiprocessing has already ended its
     children (daemonic ones terminated, the others joined), and torch's
     workers exit by themselves once they see their parent gone: the death
     signal only makes that hold when the parent dies without cleaning up (a
     crash, SIGKILL, ``os._exit``), and frees an OOM-killed rank's memory
     before its host starts a new one.
   * bare ``os.fork()`` children are not armed: nothing waits for them at a
     clean exit, so a fire-and-forget child must be able to outlive its
     parent.  They release the TCP sockets all the same; one meant to outlive
     a crash should also point its stdout and stderr elsewhere, or horovodrun
     waits for it.
   * the death signal fires when the *thread* that forked ends, not the
     process.  A Python process's main thread lives as long as the process;
     any other thread may end while the process and its children go on (a
     DataLoader first iterated in a helper thread keeps persistent workers),
     so children of other threads are left to torch's own watchdog (up to 5 s).
   * SIGKILL, not SIGTERM: the child inherited the parent's Python signal
     handlers (a graceful-stop handler would only set a flag in the orphan),
     and a worker blocked in I/O runs no Python handler at all.
   * a parent that dies between ``fork`` and ``prctl`` would go unnoticed, so
     the child compares ``getppid()`` with the pid recorded before the fork
     and kills itself if they differ.

Not affected: ``spawn`` and ``forkserver`` children (exec'd, they receive
only the descriptors multiprocessing passes them; no at-fork hook runs), and
``subprocess`` children (they exec with exactly the descriptors
``close_fds``/``pass_fds`` say, so the hook leaves them alone even when a
``preexec_fn`` makes Python run it).  Forks made before :func:`install` and
forks from C code (which run no Python at-fork hooks) are not covered.

Off switch: ``HVD_ELASTIC_FORK_SAFETY=0`` (any false value of
:func:`hvd_elastic.consul.config.parse_bool`), read by the first :func:`install`.
Without Linux's ``/proc`` :func:`install` logs one warning and does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading

from hvd_elastic.consul.config import parse_bool

log = logging.getLogger(__name__)

#: Set to a false boolean ("0", "false") to turn the hooks off.
ENV = "HVD_ELASTIC_FORK_SAFETY"

FD_DIR = "/proc/self/fd"
TCP_TABLES = ("/proc/self/net/tcp", "/proc/self/net/tcp6")
_TCP_NAMES = (b"TCP", b"TCPv6")  # what Linux names TCP sockets (MPTCP, SCTP, UDP, UNIX... differ)
_PR_SET_PDEATHSIG = 1

_installed: bool | None = None  # the first install()'s answer
_prctl = None  # libc's prctl, resolved in the parent: a child must not dlopen (loader locks after fork)
# Written by the before-fork hook; the GIL is held from it to fork(), so no other fork interleaves.
_fork_parent_pid = 0
_fork_from_main_thread = False


def install() -> bool:
    """Register the at-fork hooks once; return whether they are active in this process.

    Raises :class:`hvd_elastic.consul.config.ConfigError` if ``HVD_ELASTIC_FORK_SAFETY``
    holds no boolean.
    """
    global _installed, _prctl
    if _installed is not None:
        return _installed
    if not parse_bool(ENV, os.environ.get(ENV, "1")):
        log.info("fork safety is off (%s=%s): forked children keep this process's TCP connections",
                 ENV, os.environ[ENV])
        _installed = False
        return False
    missing = _unsupported()
    if missing:
        log.warning("fork safety is unavailable (%s): forked children keep this process's TCP connections",
                    missing)
        _installed = False
        return False
    try:
        _prctl = ctypes.CDLL(None, use_errno=True).prctl
        _prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        _prctl.restype = ctypes.c_int
    except (OSError, AttributeError) as exc:
        log.warning("fork safety cannot set a parent-death signal (%s): orphaned DataLoader workers "
                    "outlive a killed rank until they notice it", exc)
        _prctl = None
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
    _installed = True
    log.debug("fork safety installed: forked children release inherited TCP sockets")
    return True


def tcp_socket_fds() -> list[int]:
    """This process's descriptors that are TCP sockets (IPv4 or IPv6), sorted.

    The kernel names each socket's protocol (the ``system.sockprotoname``
    attribute of ``/proc/self/fd/N``): one call per socket, where looking the
    inodes up in ``/proc/self/net/tcp{,6}`` reads every connection of the
    network namespace (40 ms per fork measured with 2800 of them).  That
    lookup is the fallback for a kernel that does not name its sockets.
    """
    unnamed: dict[str, int] = {}  # inode -> fd
    found: list[int] = []
    for name in os.listdir(FD_DIR):
        path = f"{FD_DIR}/{name}"
        try:
            target = os.readlink(path)
        except OSError:
            continue  # the listing's own descriptor, already closed
        if not target.startswith("socket:["):
            continue
        try:
            protocol = os.getxattr(path, "system.sockprotoname").rstrip(b"\0")
        except FileNotFoundError:
            continue
        except OSError:
            unnamed[target[len("socket:["):-1]] = int(name)
            continue
        if protocol in _TCP_NAMES:
            found.append(int(name))
    if unnamed:
        found.extend(_listed_in_tcp_tables(unnamed))
    return sorted(found)


def _listed_in_tcp_tables(by_inode: dict[str, int]) -> list[int]:
    """The descriptors of ``by_inode`` whose socket inode the kernel's TCP tables list.

    The tables hold bound and connected sockets only: a TCP socket that is
    neither carries no connection and is left alone.
    """
    by_inode = dict(by_inode)
    found: list[int] = []
    for table in TCP_TABLES:
        try:
            f = open(table)
        except FileNotFoundError:
            continue  # a kernel without IPv6
        with f:
            next(f, None)  # header
            for line in f:
                fields = line.split()
                fd = by_inode.pop(fields[9], None) if len(fields) > 9 else None  # field 9: the inode
                if fd is not None:
                    found.append(fd)
                    if not by_inode:
                        return found
    return found


def release_tcp_sockets() -> list[int]:
    """Drop this process's references to its TCP sockets (see the module docstring); return the numbers."""
    fds = tcp_socket_fds()
    if fds:
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            for fd in fds:
                os.dup2(null, fd, inheritable=False)
        finally:
            os.close(null)
    return fds


# -- hooks -------------------------------------------------------------------------------------


def _unsupported() -> str | None:
    """Why the hooks cannot work here, or None."""
    if not sys.platform.startswith("linux"):
        return f"not Linux but {sys.platform}"
    if not os.path.isdir(FD_DIR):
        return f"no {FD_DIR}"
    return None


def _before_fork() -> None:
    global _fork_parent_pid, _fork_from_main_thread
    _fork_parent_pid = os.getpid()
    # In the child the forking thread IS the main thread, so ask here.
    _fork_from_main_thread = threading.current_thread() is threading.main_thread()


def _after_fork_in_child() -> None:
    # Frame 1 is the Python code that called os.fork() (the hook runs inside it).
    try:
        caller = sys._getframe(1)
    except ValueError:
        caller = None  # forked by C code with no Python frame above
    if caller is not None and caller.f_globals.get("__name__") == "subprocess":
        return  # preexec_fn: the exec'd program gets what close_fds/pass_fds say, pass_fds included
    try:
        release_tcp_sockets()
    except OSError:
        pass  # /proc gone in this child (a chroot, an unmount): never break a fork
    if _prctl is not None and _fork_from_main_thread and _is_multiprocessing_fork(caller):
        _die_with_parent()


def _is_multiprocessing_fork(caller) -> bool:
    """Whether multiprocessing's "fork" start method is starting a ``Process``.

    ``multiprocessing.popen_fork.Popen._launch`` calls ``os.fork()``; were that
    ever moved, its children would merely not die with the parent.
    """
    return caller is not None and caller.f_globals.get("__name__") == "multiprocessing.popen_fork"


def _die_with_parent() -> None:
    if _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return  # refused (seccomp): torch's watchdog still ends a DataLoader worker, later
    if os.getppid() != _fork_parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)  # the parent died before prctl took effect
