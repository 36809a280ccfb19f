"""Which horovodrun job a discovery call belongs to, and the job's private directory.

horovodrun runs the discovery script through ``safe_shell_exec``, whose
middleman process calls ``setsid()`` and whose parent is the horovodrun
driver, or, under hvd-elastic's rules, a multiprocessing forkserver that
horovodrun started (:mod:`hvd_elastic.horovodrun.startup`), whose parent is.
That process names the job; with its start time (against pid reuse) it forms
the job key ``<pid>-<start ticks>``.
A test or benchmark that runs discovery with ``start_new_session=True`` stands
in for horovodrun the same way.

Everything discovery keeps per job lives in ``<state dir>/<job key>/``: the
first-call marker (:mod:`.firstcall`) and the host cache with its watcher's
lock and log (:mod:`.cache`, :mod:`.watch`).  The state directory is
``$HVD_ELASTIC_DISCOVERY_STATE_DIR``, else ``$XDG_RUNTIME_DIR/hvd-elastic``,
else ``/tmp/hvd-elastic-<uid>``; it and every job directory are created mode
0700 and used only while owned by this user and closed to everyone else.

Import-light (``os`` only): the warm discovery path imports this every second.
"""

from __future__ import annotations

import os

from hvd_elastic.procfs import stat_fields


def proc_stat(pid: int) -> tuple[int, str]:
    """(parent pid, start time in clock ticks) of a process from ``/proc``; raises OSError/ValueError."""
    fields = stat_fields(pid)[1]
    return int(fields[1]), fields[19].decode("ascii")


def job_process() -> tuple[int, str] | None:
    """(pid, start ticks) of the process that started our session (through a forkserver: the process that
    started the forkserver), or None when unknown."""
    try:
        job_pid, _ = proc_stat(os.getsid(0))
        if job_pid > 1 and _is_forkserver(job_pid):
            job_pid, _ = proc_stat(job_pid)
        if job_pid <= 1:
            return None
        _, started = proc_stat(job_pid)
    except (OSError, ValueError, IndexError):
        return None
    return job_pid, started


def _cmdline(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def _is_forkserver(pid: int) -> bool:
    """True when ``pid`` is a multiprocessing forkserver (``python -c 'from multiprocessing.forkserver ...'``)."""
    return any(b"multiprocessing.forkserver import main" in arg for arg in _cmdline(pid))


def is_horovodrun(pid: int) -> bool:
    """True when process ``pid`` runs horovodrun (the console script or ``-m horovod.runner.launch``)."""
    args = _cmdline(pid)
    return any(os.path.basename(a) == b"horovodrun" or a in (b"horovod.runner.launch", b"horovod.runner") for a in args)


def alive(pid: int, started: str) -> bool:
    """True while process ``pid`` runs and is the one that started at ``started`` (not a reused pid).

    A zombie has exited: it counts as gone even while nobody reaps it (a
    container's init may never do so).
    """
    try:
        fields = stat_fields(pid)[1]
    except (OSError, IndexError):
        return False
    return len(fields) > 19 and fields[0] not in (b"Z", b"X") and fields[19].decode("ascii") == started


def is_private_dir(path: str) -> bool:
    """A real directory (no symlink) owned by this user that nobody else may read or write."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return (info.st_mode & 0o170000) == 0o040000 and info.st_uid == os.getuid() and not info.st_mode & 0o077


def state_dir(create: bool = True) -> str | None:
    """This user's discovery state directory, or None when it is missing or not private."""
    path = os.environ.get("HVD_ELASTIC_DISCOVERY_STATE_DIR")
    if not path:
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        path = os.path.join(runtime, "hvd-elastic") if runtime else f"/tmp/hvd-elastic-{os.getuid()}"
    if create:
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError:
            return None
    return path if is_private_dir(path) else None


def job_dir(job: tuple[int, str] | None, create: bool = True) -> str | None:
    """The private directory of ``job`` (see :func:`job_process`), or None when unusable."""
    if job is None:
        return None
    base = state_dir(create)
    if base is None:
        return None
    path = os.path.join(base, f"{job[0]}-{job[1]}")
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return None
    return path if is_private_dir(path) else None
