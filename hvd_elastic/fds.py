"""This process's file descriptors: where Linux lists them, and releasing one without closing it.

Stdlib only.  Used in forked children (:mod:`hvd_elastic.training._internal.forksafe` for
Gloo's connections, :mod:`hvd_elastic.metrics.exporter` for a listening port).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

FD_DIR = "/proc/self/fd"
FDINFO_DIR = "/proc/self/fdinfo"


def release(fds: Iterable[int]) -> None:
    """Drop this process's reference to each descriptor, keeping its number taken.

    ``/dev/null`` is ``dup2``-ed over the number: the file description (a socket
    the parent still uses) loses this process as a holder, so it closes when its
    other holders do, while the number cannot be reused by an unrelated file that
    an inherited object still holding it would then read, write or close.  Never
    ``shutdown()``: that would act on the connection for every holder.
    """
    fds = list(fds)
    if not fds:
        return
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        for fd in fds:
            os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)
