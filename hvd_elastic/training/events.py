"""The job's event log: one JSON object per line, readable after the run.

One file per job.  Whichever process is rank 0 at the moment appends to it (the
:func:`hvd_elastic.run` decorator decides who writes; this class only writes).
Rank 0 is the process that sees every reset: Horovod notifies the coordinator of
host changes and keeps rank 0 on the oldest surviving host.  Each record is
written with a single ``write`` on a file opened with ``O_APPEND``, so records
from a retiring and a new rank 0 interleave whole, and a job killed mid-write
leaves at most one truncated last line, which :meth:`EventLog.read` skips.

Every record has ``time`` (Unix seconds) and ``event``; the decorator adds
``rank``, ``size``, ``host`` and ``pid``.  Events written by the decorator:

=================== ==========================================================
``start``           a process entered the training function for the first time
``resume``          rank 0 loaded a checkpoint: ``path``, ``step``, ``epoch``,
                    ``commit_count``, ``sequence``
``checkpoint_skipped`` an invalid checkpoint was passed over: ``path``, ``reason``
``commit``          ``seconds``, ``commit_count``, ``bytes`` (from the state)
``sync``            ``seconds``, ``bytes`` (from the state)
``restore``         the state rolled back to its last commit
``reset``           ``reason`` (``hosts_updated`` with ``hosts``: ``added``,
                    ``removed`` or ``mixed``; or ``internal_error`` with
                    ``message``), ``old_size``, ``new_size``,
                    ``interrupted_at`` (when the function was interrupted),
                    ``notified_at`` (hosts_updated: when rank 0 first heard
                    of the change; None if the interrupt came first),
                    ``joined_ahead`` (hosts_updated: the survivors trained
                    on while the newcomers started, see
                    ``training/_internal/join_ahead.py``); the
                    record's ``time`` is when training resumed after the sync
``checkpoint``      a write finished: ``path``, ``bytes``, ``seconds``, step...
``checkpoint_error`` a write failed: ``path``, ``error``
``pace``            a straggler window closed (every ``straggler_window``
                    commits, worlds of 2 ranks or more): ``job_median_s``
                    (the ranks' median own work per step, seconds),
                    ``judged`` (3 ranks or more), ``hosts`` (by name:
                    ``s``, the host's median, ``ratio`` to the job's,
                    ``ranks``, ``slow`` in this window); see
                    ``training/_internal/pace.py``
``straggler``       a host was slow in ``windows`` windows in a row (once
                    per streak): ``slow_host``, ``ratio``, ``host_s``,
                    ``job_median_s``, ``ranks``, ``window`` (commits each),
                    ``policy`` (``report``: nothing was done; ``drain``:
                    a ``straggler_drain`` record follows)
``straggler_drain`` policy ``drain``: what became of the slowest new
                    straggler of a window: ``slow_host``, ``status``
                    (``requested``: its node agent was asked; ``skipped``
                    with ``why``: a limit held; ``refused``: Consul's ACLs;
                    ``failed``), ``why``, ``instances`` (``node/service id``
                    asked); see ``training/_internal/straggler_drain.py``
``finish``          the training function returned: ``commit_count``
``abort``           the call ended with an exception: ``error``
=================== ==========================================================

:data:`EVENTS` names them in that order; readers (``hvd-elastic report``) take
their list from it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)

#: Every event the decorator and its checkpoint writer append (the table above).
EVENTS = ("start", "resume", "checkpoint_skipped", "commit", "sync", "restore", "reset", "checkpoint",
          "checkpoint_error", "pace", "straggler", "straggler_drain", "finish", "abort")


class EventLog:
    """Appends events to a JSON-lines file.

    Args:
        path: the log file; its directory is created if missing.
        context: called for every record; its fields (rank, size, ...) are added
            before the event's own fields.

    Thread-safe; the file is opened on the first event, so a process that never
    writes never creates it.
    """

    def __init__(self, path: str | os.PathLike, *, context: Callable[[], dict] | None = None) -> None:
        self.path = Path(path)
        self._context = context
        self._lock = threading.Lock()
        self._fd: int | None = None

    def emit(self, event: str, **fields: Any) -> dict:
        """Append one record and return it.  I/O errors are logged, not raised:
        the event log must never stop training."""
        record = {"time": round(time.time(), 6), "event": event}
        if self._context is not None:
            record.update(self._context())
        record.update(fields)
        line = (json.dumps(record, default=str, separators=(",", ":")) + "\n").encode()
        with self._lock:
            try:
                if self._fd is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                os.write(self._fd, line)
            except OSError as exc:
                log.error("could not append %s event to %s: %s", event, self.path, exc)
        return record

    def close(self) -> None:
        """Flush the file to disk and close it.  Idempotent."""
        with self._lock:
            if self._fd is None:
                return
            try:
                os.fsync(self._fd)
            except OSError as exc:
                log.warning("could not fsync %s: %s", self.path, exc)
            os.close(self._fd)
            self._fd = None

    @staticmethod
    def read(path: str | os.PathLike, *, event: str | None = None) -> list[dict]:
        """All records in ``path`` (only those named ``event`` if given), in order.

        A line that is not a JSON object (the torn last line of a killed job) is
        skipped with a warning naming the file and line number.
        """
        with open(path, "rb") as f:
            lines = f.read().splitlines()

        def bad(number: int, _raw: bytes) -> None:
            log.warning("%s:%d: skipping a line that is not a JSON object", path, number)

        return [record for _, record in json_objects(lines, bad) if event is None or record.get("event") == event]


def json_objects(lines: Iterable[bytes], on_bad: Callable[[int, bytes], None]) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each line holding a JSON object; ``on_bad(number, line)`` for the others.

    Blank lines are neither.  Shared by every reader of the project's JSON-lines files.
    """
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except ValueError:
            record = None
        if isinstance(record, dict):
            yield number, record
        else:
            on_bad(number, raw)


def describe_error(exc: BaseException) -> str:
    """``"TypeName: first line of the message"``, short enough for one event field."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
