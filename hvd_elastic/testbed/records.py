"""Reading the JSON-lines files that workers append to while a test watches."""

from __future__ import annotations

import bisect
import glob
import json
from pathlib import Path

from .job import Job, JobError


class JsonLines:
    """Every complete line of the files matching ``pattern``, read incrementally.

    Workers append while the reader polls, so a line is taken only once its
    newline is written; a torn last line left by a SIGKILLed writer is never
    taken (it has no newline).  :meth:`rows` returns a new list of every row read
    so far, :meth:`new_rows` only those no earlier call returned.  Each file's rows
    keep their order; the rows a call finds come after those of earlier calls
    (files in path order within a call), so rows of different files interleave:
    sort on a field (``time``, ``step``) where the order across files matters.
    """

    def __init__(self, pattern: str | Path):
        self.pattern = str(pattern)
        self._offsets: dict[str, int] = {}
        self._rows: list[dict] = []

    def rows(self) -> list[dict]:
        self.new_rows()
        return list(self._rows)

    def new_rows(self) -> list[dict]:
        first = len(self._rows)
        for path in sorted(glob.glob(self.pattern)):
            with open(path, "rb") as f:
                f.seek(self._offsets.get(path, 0))
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]
            self._offsets[path] = self._offsets.get(path, 0) + len(complete)
            for line in complete.splitlines():
                try:
                    self._rows.append(json.loads(line))
                except ValueError as exc:
                    raise ValueError(f"{path}: not a JSON line {line[:200]!r}: {exc}") from None
        return self._rows[first:]


def _time(row: dict) -> float:
    return row["time"]


class WorldSizes:
    """The world sizes one rank trained at, from the step rows workers append.

    A row is a JSON object with at least ``rank``, ``size`` and ``time`` (wall-clock
    seconds when the step ran); one with an ``event`` other than ``"step"`` (a reset,
    a restore) is not a step.  Steps are ordered by ``time``: a step counter may go
    back after a rollback, the clock does not.
    """

    def __init__(self, pattern: str | Path, rank: int = 0):
        self.lines = JsonLines(pattern)
        self.rank = rank
        self._rows: list[dict] = []  # kept sorted; new rows are nearly always the newest, so insort is cheap

    def rows(self) -> list[dict]:
        """Every row so far (all ranks, all events), oldest first."""
        for row in self.lines.new_rows():
            bisect.insort(self._rows, row, key=_time)
        return list(self._rows)

    def steps(self) -> list[dict]:
        """This rank's step rows, oldest first."""
        return [r for r in self.rows() if r["rank"] == self.rank and r.get("event", "step") == "step"]

    def sequence(self) -> list[int]:
        """The world sizes this rank trained at, in order, repeats collapsed."""
        seq: list[int] = []
        for row in self.steps():
            if not seq or seq[-1] != row["size"]:
                seq.append(row["size"])
        return seq

    def first_step_at(self, size: int, since: float = 0.0) -> float | None:
        """The time of this rank's first step at ``size`` after wall time ``since``, or None."""
        return next((r["time"] for r in self.steps() if r["time"] > since and r["size"] == size), None)

    def wait_for_size(self, job: Job, size: int, timeout: float, since: float = 0.0) -> float:
        """Wait (while ``job`` runs) for :meth:`first_step_at`; returns that step's time."""
        try:
            return job.wait_until(f"rank {self.rank} to train at world size {size}",
                                  lambda: self.first_step_at(size, since), timeout, interval=0.05)
        except JobError as exc:
            raise JobError(f"world sizes so far: {self.sequence()}\n{exc}") from None
