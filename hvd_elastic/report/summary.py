"""A run's report: its membership timeline, summary, exactly-once verdict and picture.

``hvd-elastic report`` (:mod:`hvd_elastic.commands.report`) prints it; the demo
and the benchmarks build it the same way.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from .runlog import RunLog, read_run
from .timeline import Timeline, build, format_table

log = logging.getLogger("hvd_elastic.report")

PNG_NAME = "report.png"


@dataclasses.dataclass
class Report:
    run: RunLog
    timeline: Timeline
    exactly_once: str | None  # the ledger verdict's line; None when the run keeps no ledger
    exactly_once_ok: bool | None  # None: not checked (no ledger, or the job has not finished)
    text: str

    @property
    def ok(self) -> bool:
        """Training finished and the ledger verdict (when there is a ledger) holds."""
        return self.timeline.finished and self.exactly_once_ok is not False


def make_report(run_dir: str | Path) -> Report:
    """Read ``run_dir`` and build its report (no picture); warns once per skipped line."""
    run_log = read_run(run_dir)
    for warning in run_log.warnings:
        log.warning("%s", warning)
    timeline = build(run_log)
    verdict_line, verdict_ok = _exactly_once(run_log.directory)
    lines = [f"run {run_log.directory}", format_table(timeline), _summary(timeline), *_pace(run_log, timeline)]
    if verdict_line is not None:
        lines.append(verdict_line)
    return Report(run_log, timeline, verdict_line, verdict_ok, "\n".join(lines))


def draw_png(report: Report, path: str | Path | None = None) -> Path:
    from .plot import draw  # matplotlib only when a picture is wanted

    return draw(report.run, report.timeline, Path(path) if path else report.run.directory / PNG_NAME)


def _summary(timeline: Timeline) -> str:
    changes = timeline.changes
    recoveries = [c.recovery_s for c in changes if c.recovery_s is not None]
    rolled = sum(c.rolled_back or 0 for c in changes)
    last = timeline.last_step
    state = "finished" if timeline.finished else "not finished (still running, or stopped)"
    where = (f"; last committed step {last['step']} at world size {last['size']}"
             + (f", epoch {last['epoch']}" if "epoch" in last else "")
             + (f", loss {last['loss']:.4f}" if isinstance(last.get("loss"), (int, float)) else "")) if last else ""
    longest = f", longest recovery {max(recoveries):.1f} s" if recoveries else ""
    plural = "" if len(changes) == 1 else "s"
    summary = (f"{len(changes)} membership change{plural}{longest}, {rolled} committed steps rolled back in all; "
               f"training {state}{where}")
    share = timeline.stalled_share
    if share and share[1] > 0:
        summary += (f"\nno step committed for {share[0]:.1f} s of the {share[1]:.1f} s from the first committed step "
                    f"to the last ({100 * share[0] / share[1]:.0f}%: the picture's grey)")
    return summary


def _pace(run: RunLog, timeline: Timeline) -> list[str]:
    """A line per ``straggler`` event (else ``stragglers: none``), then each host's speed in the last window;
    nothing for a run without straggler windows (too short, one rank, or the detector off)."""
    windows = [e for e in run.events if e["event"] == "pace" and isinstance(e.get("hosts"), dict)]
    reported = [e for e in run.events if e["event"] in ("straggler", "straggler_drain")]
    if not windows and not reported:
        return []
    t0 = timeline.start or 0.0
    lines = [_straggler_line(e, e["time"] - t0) for e in reported] or ["stragglers: none"]
    if windows:
        last = windows[-1]
        speeds = [f"{host} {1 / h['ratio']:.2f}" for host, h in last["hosts"].items()
                  if isinstance(h, dict) and isinstance(h.get("ratio"), (int, float)) and h["ratio"] > 0]
        median = last.get("job_median_s")
        lines.append(f"host speed in the last straggler window (1 = the job's median rank"
                     f"{f', {median:.4f} s of own work per step' if isinstance(median, (int, float)) else ''}): "
                     f"{', '.join(speeds) or '-'}")
    return lines


def _straggler_line(event: dict, at: float) -> str:
    if event["event"] == "straggler_drain":
        status = event.get("status", "?")
        why = "" if status == "requested" else f" ({event.get('why', '')})"
        return f"straggler drain of {event.get('slow_host', '?')} at {at:.1f} s: {status}{why}"
    return (f"straggler: {event.get('slow_host', '?')} at {at:.1f} s: {event['ratio']:.2f}x the job's median own "
            f"work per step ({event['host_s']:.4f} s vs {event['job_median_s']:.4f} s) in "
            f"{event.get('windows', '?')} windows of {event.get('window', '?')} commits in a row; policy "
            f"{event.get('policy', '?')}")


def _exactly_once(directory: Path) -> tuple[str | None, bool | None]:
    """The ledger verdict as one line, and whether it holds (None: not checked)."""
    if not (directory / "ledger").is_dir():
        return None, None
    if not any(directory.glob("final-*.json")):
        return "exactly-once: not checked yet (no final-<rank>.json: the job has not finished)", None
    from .ledger import verdict

    try:
        result = verdict(directory)
    except (ValueError, KeyError, TypeError) as exc:  # a ledger or final file that is not what .evidence writes
        return f"exactly-once: FAILED: unreadable evidence: {exc}", False
    problems = result.problems()
    if problems:
        return f"exactly-once: FAILED: {'; '.join(problems)}", False
    return (f"exactly-once: OK: each of the {result.samples} samples trained exactly once in each of "
            f"{result.epochs} epochs (ledgers of every rank; rolled-back steps excluded)"), True
