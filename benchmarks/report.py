"""What every benchmark reports: the spread of its samples, ratios to a named baseline, one table, one JSON file.

A ratio is only as good as its baseline and its sample count, so a
:class:`Row` carries both and the table prints them next to the ratio.
Baseline and measured samples come from interleaved rounds, so a ratio is
taken round by round (``paired_ratio``): load that hits one round hits both
sides of its ratio alike.

    from report import Row, spread, paired_ratio, print_table, write_json
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

RESULTS = Path(__file__).resolve().parent / "results"


def spread(samples: Sequence[float]) -> dict[str, float]:
    """n, median, p10/p90, min/max, and a 90% confidence interval of the median.

    The interval comes from order statistics (no assumption about the
    distribution): the target is resolved only when it lies outside it.
    """
    xs = sorted(samples)
    n = len(xs)
    if n == 0:
        raise ValueError("no samples")
    deciles = statistics.quantiles(xs, n=10, method="inclusive") if n > 1 else [xs[0]] * 9
    k = max(0, math.floor((n - 1.645 * math.sqrt(n)) / 2))
    return {"n": n, "median": statistics.median(xs), "p10": deciles[0], "p90": deciles[8],
            "min": xs[0], "max": xs[-1], "median_ci90": [xs[k], xs[n - 1 - k]]}


def paired_ratio(measured: Sequence[float], baseline: Sequence[float]) -> dict[str, float]:
    """The spread of ``measured[i] / baseline[i]``, one ratio per interleaved round."""
    if len(measured) != len(baseline):
        raise ValueError(f"{len(measured)} measured samples against {len(baseline)} baseline samples")
    return spread([m / b for m, b in zip(measured, baseline)])


@dataclasses.dataclass
class Row:
    """One line of a table: a measured figure, optionally as a ratio to a named baseline."""

    label: str
    value: dict  # spread() of the measured samples
    unit: str = "s"
    baseline: str | None = None  # the baseline's name, as the table prints it
    ratio: dict | None = None  # paired_ratio() against that baseline
    target: float | None = None  # the largest ratio the project accepts

    @property
    def verdict(self) -> str:
        """met / missed by the median ratio; "unresolved" while the target lies inside its 90% interval."""
        if self.target is None or self.ratio is None:
            return ""
        lo, hi = self.ratio["median_ci90"]
        if lo <= self.target <= hi:
            return "unresolved"
        return "met" if self.ratio["median"] <= self.target else "missed"

    def as_json(self) -> dict:
        return {**dataclasses.asdict(self), "verdict": self.verdict}


def _scaled(values: Sequence[float], unit: str) -> tuple[list[str], str]:
    """Numbers of one row in one unit, chosen by the first (the median): s, ms or us."""
    if unit == "s" and values[0] < 1e-3:
        return [f"{x * 1e6:.2f}" for x in values], "us"
    if unit == "s" and values[0] < 1:
        return [f"{x * 1e3:.2f}" for x in values], "ms"
    return [f"{x:.4g}" if abs(x) < 1e4 else f"{x:.0f}" for x in values], unit


def format_table(title: str, rows: Sequence[Row]) -> str:
    """Medians with p10-p90, and for ratios the baseline's name, n and the median's 90% interval."""
    head = ("measure", "median (p10-p90)", "n", "baseline", "ratio (90% CI of median)", "target")
    lines = []
    for r in rows:
        v = r.value
        (median, p10, p90), unit = _scaled([v["median"], v["p10"], v["p90"]], r.unit)
        value = f"{median} {unit} ({p10}-{p90})"
        ratio = ""
        if r.ratio is not None:
            lo, hi = r.ratio["median_ci90"]
            ratio = f"{r.ratio['median']:.3f}x ({lo:.3f}-{hi:.3f}), n={r.ratio['n']}"
        target = f"<= {r.target:g}x: {r.verdict}" if r.target is not None else ""
        lines.append((r.label, value, str(v["n"]), r.baseline or "", ratio, target))
    widths = [max(len(line[i]) for line in [head, *lines]) for i in range(len(head))]
    out = [title, "  ".join(h.ljust(w) for h, w in zip(head, widths))]
    out += ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
    return "\n".join(out)


def machine() -> dict:
    """Where and under what load the figures were taken."""
    return {"python": sys.version.split()[0], "executable": sys.executable, "flags": sys.flags.__repr__(),
            "platform": platform.platform(), "cpus": os.cpu_count(), "load_average": os.getloadavg(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def load_note(at_start: Sequence[float]) -> str:
    """The 1-minute load average at the start and now, for a table's title."""
    return f"load average {at_start[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end"


def write_json(path: Path, report: dict) -> Path:
    """``report`` plus the machine it ran on, as JSON at ``path`` (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**report, "machine": machine()}, indent=2, default=_jsonable) + "\n")
    return path


def _jsonable(value):
    if isinstance(value, Row):
        return value.as_json()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
