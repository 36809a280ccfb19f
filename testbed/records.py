"""The world sizes a job's ranks trained at, read from the step rows its workers append."""

from __future__ import annotations

import bisect
from pathlib import Path

from hvd_elastic.local.job import Job, JobError
from hvd_elastic.report.jsonlines import JsonLines


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
