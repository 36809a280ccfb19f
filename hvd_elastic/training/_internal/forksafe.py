"""Forked children of a training process never hold its Gloo connections, and DataLoader workers
never outlive a crash.

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
StatefulDataLoader workers, ``socketserver.ForkingMixIn`` handlers):

1. Gloo's connections are released: the TCP sockets of every event loop shaped
   like Gloo's (:func:`hvd_elastic.training._internal.gloo_hangup.gloo_endpoints`).
   Nothing else is touched: the child's other inherited TCP sockets (a
   forking server's accepted connection, a pre-fork listener, a database
   connection handed to it) keep working, as do pipes, unix sockets
   (multiprocessing queues, the descriptor passing of shared-memory tensors),
   files, eventfds and epoll descriptors.  *Released* means ``/dev/null`` is
   ``dup2``-ed over the number: the child's reference to the connection is
   dropped, so the parent's death resets it at once, while the number stays
   taken, so an inherited C++ object that still holds it fails (ENOTSOCK)
   instead of reading, writing or later closing an unrelated file that reuses
   the number.  Never ``shutdown()``: that would act on the connection the
   parent still uses.  The parent is untouched.
2. A *daemonic* multiprocessing child (the ``fork`` start method; every
   DataLoader worker is one: torch sets ``daemon``) forked by the parent's
   *main thread* dies with the parent: ``PR_SET_PDEATHSIG`` with SIGKILL.
   Why this scope:

   * releasing sockets is not enough: through the shared output, a worker
     outliving a crashed rank holds up the job's recovery.  ``daemon`` is the
     caller's word that the child ends with its parent (multiprocessing
     terminates daemonic children at exit); the death signal only makes that
     hold when the parent dies without cleaning up (a crash, SIGKILL,
     ``os._exit``), and frees an OOM-killed rank's memory before its host
     starts a new one.
   * non-daemonic multiprocessing children and bare ``os.fork()`` children
     are not armed: their lifetime is the user's (a clean exit joins the
     first; nothing waits for the second, which may be meant to outlive its
     parent).  One meant to outlive a crash should also point its stdout and
     stderr elsewhere, or horovodrun waits for it.
   * the death signal fires when the *thread* that forked ends, not the
     process.  A Python process's main thread lives as long as the process;
     any other thread may end while the process and its children go on (a
     DataLoader first iterated in a helper thread keeps persistent workers),
     so children of other threads are left to torch's own watchdog (up to 5 s).
     Which thread forked is thread-local state of the before-fork hook, so
     forks racing in two threads never see each other's answer.
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

Off switch: ``HVD_ELASTIC_FORK_SAFETY=0`` (the worker's ``fork_safety`` setting,
:mod:`hvd_elastic.training.settings`), as the first :func:`install` is given it.
Without Linux's ``/proc`` :func:`install` logs one warning and does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
from typing import Any

from hvd_elastic.fds import FD_DIR, release
from hvd_elastic.training._internal import gloo_hangup
from hvd_elastic.training.settings import FORK_SAFETY_ENV

log = logging.getLogger(__name__)

#: Set to a false boolean ("0", "false") to turn the hooks off.
ENV = FORK_SAFETY_ENV

_PR_SET_PDEATHSIG = 1

_installed: bool | None = None  # the first install()'s answer
_prctl: Any = None  # libc's prctl, resolved in the parent: a child must not dlopen (loader locks after fork)
# Written by the before-fork hook of the forking thread, read in its child (the same thread, and
# thread-local data survives the fork).  A module global would be overwritten by a fork in another
# thread between this hook and this thread's fork: other before-fork hooks and the import lock may
# release the GIL in between.
_fork = threading.local()


def install(enabled: bool) -> bool:
    """Register the at-fork hooks once; return whether they are active in this process.

    ``enabled``: the worker's ``fork_safety`` setting (``HVD_ELASTIC_FORK_SAFETY``,
    :mod:`hvd_elastic.training.settings`); the first call decides for the process.
    """
    global _installed, _prctl
    if _installed is not None:
        return _installed
    if not enabled:
        log.info("fork safety is off (%s): forked children keep this process's Gloo connections", ENV)
        _installed = False
        return False
    missing = _unsupported()
    if missing:
        log.warning("fork safety is unavailable (%s): forked children keep this process's Gloo connections",
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
    log.debug("fork safety installed: forked children release inherited Gloo connections")
    return True


def release_gloo_sockets() -> list[int]:
    """Drop this process's references to its Gloo connections (see the module docstring); return the numbers."""
    fds = gloo_hangup.gloo_sockets()
    release(fds)
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
    _fork.parent_pid = os.getpid()
    # In the child the forking thread IS the main thread, so ask here.
    _fork.from_main_thread = threading.current_thread() is threading.main_thread()


def _after_fork_in_child() -> None:
    # Frame 1 is the Python code that called os.fork() (the hook runs inside it).
    try:
        caller = sys._getframe(1)
    except ValueError:
        caller = None  # forked by C code with no Python frame above
    if caller is not None and caller.f_globals.get("__name__") == "subprocess":
        return  # preexec_fn: the exec'd program gets what close_fds/pass_fds say, pass_fds included
    try:
        release_gloo_sockets()
    except OSError:
        pass  # /proc gone in this child (a chroot, an unmount): never break a fork
    if _prctl is not None and getattr(_fork, "from_main_thread", False) and _is_daemonic_process(caller):
        _die_with_parent()


def _is_daemonic_process(caller) -> bool:
    """Whether multiprocessing's "fork" start method is starting a daemonic ``Process``.

    ``multiprocessing.popen_fork.Popen._launch(self, process_obj)`` calls
    ``os.fork()``; were that ever moved or renamed, its children would merely
    not die with the parent.
    """
    if caller is None or caller.f_globals.get("__name__") != "multiprocessing.popen_fork":
        return False
    return getattr(caller.f_locals.get("process_obj"), "daemon", False) is True


def _die_with_parent() -> None:
    if _prctl is None:
        return  # install() found no prctl: it logged why
    if _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return  # refused (seccomp): torch's watchdog still ends a DataLoader worker, later
    if os.getppid() != _fork.parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)  # the parent died before prctl took effect
