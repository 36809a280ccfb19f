"""Tell a job's first discovery call from the later ones.

horovodrun shuts the job down when its FIRST discovery call fails, but only
warns and keeps the previous hosts when a later call fails.  So the first call
may wait a few seconds for Consul (a node and its agent often boot together),
while later calls must stay short: horovodrun holds a lock while they run.

How a call knows it is the first: horovodrun runs the script through
``safe_shell_exec``, whose middleman process calls ``setsid()`` and whose
parent is the horovodrun driver.  The parent of our session leader therefore
names the job; with its start time (against pid reuse) it keys a marker file
written after the first success.  Where this cannot be worked out (no
``/proc``, a state directory that is not private to this user) every call is
treated as a later one: the safe side, it never stalls horovodrun.

Markers are empty files in ``$HVD_ELASTIC_DISCOVERY_STATE_DIR``, else
``$XDG_RUNTIME_DIR/hvd-elastic``, else ``/tmp/hvd-elastic-<uid>``, created
mode 0700 and checked to be owned by this user.
"""

from __future__ import annotations

import os
import re
import stat


def _proc_stat(pid: int) -> tuple[int, str]:
    """(parent pid, start time in clock ticks) of a process from /proc."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[1]), fields[19]


def job_key() -> str | None:
    """An identifier of the process that started our session, or None when unknown."""
    try:
        job_pid, _ = _proc_stat(os.getsid(0))
        if job_pid <= 1:
            return None
        _, started = _proc_stat(job_pid)
    except (OSError, ValueError, IndexError):
        return None
    return f"{job_pid}-{started}"


def _state_dir() -> str | None:
    path = os.environ.get("HVD_ELASTIC_DISCOVERY_STATE_DIR")
    if not path:
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        path = os.path.join(runtime, "hvd-elastic") if runtime else f"/tmp/hvd-elastic-{os.getuid()}"
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError:
        return None
    private = stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077
    return path if private else None


class FirstCall:
    """Whether this call is the job's first, and a way to record a success."""

    def __init__(self, scope: str):
        key, directory = job_key(), _state_dir()
        safe_scope = re.sub(r"[^A-Za-z0-9_.-]", "_", scope)[:64]
        self._marker = os.path.join(directory, f"{key}-{safe_scope}") if key and directory else None

    @property
    def is_first(self) -> bool:
        return self._marker is not None and not os.path.exists(self._marker)

    def record_success(self) -> None:
        if self._marker is None or os.path.exists(self._marker):
            return
        try:
            fd = os.open(self._marker, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            os.close(fd)
        except OSError:
            pass  # worst case the next call also gets the first-call window
