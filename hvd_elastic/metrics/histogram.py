"""A histogram as plain numbers: observed on every rank, carried between ranks, rendered by a collector.

``prometheus_client``'s own metric objects cannot be copied from one process to
another; the job's metrics must be (a new rank 0 continues its predecessor's
series, :mod:`.job`), so they are kept as this and rendered at scrape time.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any

#: Seconds: recoveries run from tens of milliseconds (a graceful shrink) to minutes (a Gloo timeout).
RECOVERY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
#: Seconds: commits and syncs of a few MiB to several GiB of state.
COPY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Histogram:
    """Counts per bucket (not cumulative), their sum and count."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        if math.isnan(value):
            return  # a NaN would poison the sum for the rest of the job
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, int]]:
        """``[(le, cumulative count), ...]`` ending with ``+Inf``, as ``HistogramMetricFamily`` takes them."""
        out, total = [], 0
        for bound, n in zip((*map(_le, self.bounds), "+Inf"), self.counts):
            total += n
            out.append((bound, total))
        return out

    def to_dict(self) -> dict:
        return {"counts": list(self.counts), "sum": self.sum}

    def load(self, data: Any) -> None:
        """Take ``to_dict``'s output (from another rank); one of another shape is ignored."""
        counts = data.get("counts") if isinstance(data, dict) else None
        if isinstance(counts, list) and len(counts) == len(self.counts):
            self.counts = [int(n) for n in counts]
            self.sum = float(data.get("sum", 0.0))


def _le(bound: float) -> str:
    return repr(float(bound))
