"""Tell a job's first discovery call from the later ones.

horovodrun shuts the job down when its FIRST discovery call fails, but only
warns and keeps the previous hosts when a later call fails.  So the first call
may wait a few seconds for Consul (a node and its agent often boot together),
while later calls must stay short: horovodrun holds a lock while they run.

How a call knows it is the first: :mod:`.jobdir` names the job (the
horovodrun process) and its private directory; a marker file there,
``first-<service>``, is written after the first success.  Where this cannot
be worked out (no ``/proc``, a state directory that is not private to this
user) every call is treated as a later one: the safe side, it never stalls
horovodrun.
"""

from __future__ import annotations

import os
import re

from hvd_elastic.discovery import jobdir


class FirstCall:
    """Whether this call is the job's first, and a way to record a success."""

    def __init__(self, scope: str):
        directory = jobdir.job_dir(jobdir.job_process())
        safe_scope = re.sub(r"[^A-Za-z0-9_.-]", "_", scope)[:64]
        self._marker = os.path.join(directory, f"first-{safe_scope}") if directory else None

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
