"""Membership changes of a run, with what caused them, their recovery time and the steps they rolled back.

A *change* is a ``reset`` record (the world was rebuilt: hosts added or
removed, or a collective failed) or a launch after the first (a ``start``
record: the whole job was started again, and ``resume`` says from which
checkpoint).  For each change:

* ``cause``: the last operator action (``actions.jsonl``) at or before the
  moment training was interrupted that no earlier change claimed; none when
  the run has no actions file;
* ``recovery_s``: from the cause (else from when rank 0 was notified or
  interrupted, else from the change record itself) to the first committed
  step at the new world size; None while no such step exists yet;
* ``rolled_back``: committed steps redone: the last step committed before
  the interruption minus the step before the first one committed after it
  (a crash rolls back to the last commit, a restart to the last checkpoint).
"""

from __future__ import annotations

import dataclasses
import re

from .runlog import RunLog


@dataclasses.dataclass
class Change:
    time: float  # when training resumed in the new world (the record's time)
    kind: str  # "removed", "added", "mixed", "failure" or "restart"
    old_size: int | None
    new_size: int
    detail: str  # the failure's message, the checkpoint resumed from
    cause: dict | None
    recovery_s: float | None
    rolled_back: int | None
    pause_s: float | None = None  # the survivors' pause: last committed step before it -> first at the new size


@dataclasses.dataclass
class Timeline:
    start: float | None  # the first record's time: the origin of every relative time
    first_size: int | None
    changes: list[Change]
    idle_actions: list[dict]  # actions no change was paired with
    last_step: dict | None  # the newest progress row
    finished: bool  # the last launch ran to its finish event
    stalls: list[tuple[float, float]] = dataclasses.field(default_factory=list)  # stretches without committed steps

    @property
    def stalled_share(self) -> tuple[float, float] | None:
        """(seconds without committed steps, seconds from the first to the last committed step); None: no steps."""
        if self.last_step is None or self.first_step_time is None:
            return None
        return sum(b - a for a, b in self.stalls), self.last_step["time"] - self.first_step_time

    first_step_time: float | None = None


def build(run: RunLog) -> Timeline:
    """The :class:`Timeline` of ``run`` (see the module docstring for the rules)."""
    times = [r["time"] for r in (*run.events, *run.progress, *run.actions)]
    starts = [e for e in run.events if e["event"] == "start"]
    steps = sorted(run.progress, key=lambda r: r["time"])
    sizes = run.sizes()
    actions = sorted(run.actions, key=lambda a: a["time"])
    used: set[int] = set()
    changes = []
    for record, resumed in _change_records(run.events):
        boundary = record.get("interrupted_at") or record.get("notified_at") or record["time"]
        if record["event"] == "start":  # a relaunch: its process started after the old job's last record
            boundary = resumed["time"] if resumed else record["time"]
        cause = _claim(actions, used, boundary)
        since = cause["time"] if cause else (record.get("notified_at") or boundary)
        new_size = record["size"] if record["event"] == "start" else record["new_size"]
        first_at_new = next((t for t, s in sizes if t >= record["time"] and s == new_size), None)
        changes.append(Change(
            time=record["time"], kind=_kind(record), new_size=new_size,
            old_size=record.get("old_size") if record["event"] == "reset" else _size_before(sizes, boundary),
            detail=_detail(record, resumed), cause=cause,
            recovery_s=None if first_at_new is None else max(0.0, first_at_new - since),
            rolled_back=_rolled_back(steps, boundary, record["time"]),
            pause_s=_pause(sizes, boundary, first_at_new)))
    return Timeline(
        start=min(times) if times else None, first_size=starts[0]["size"] if starts else None, changes=changes,
        idle_actions=[a for i, a in enumerate(actions) if i not in used], last_step=steps[-1] if steps else None,
        finished=bool(run.events) and run.events[-1]["event"] == "finish",
        stalls=stalls([t for t, _ in sizes]), first_step_time=sizes[0][0] if sizes else None)


def stalls(times: list[float]) -> list[tuple[float, float]]:
    """Stretches without committed steps in sorted step ``times``: gaps over 1 s and over 5 median step intervals."""
    deltas = sorted(b - a for a, b in zip(times, times[1:]))
    if not deltas:
        return []
    limit = max(1.0, 5 * deltas[len(deltas) // 2])
    return [(a, b) for a, b in zip(times, times[1:]) if b - a > limit]


def _pause(sizes: list[tuple[float, int]], boundary: float, first_at_new: float | None) -> float | None:
    before = [t for t, _ in sizes if t <= boundary]
    if not before or first_at_new is None:
        return None
    return max(0.0, first_at_new - before[-1])


def _change_records(events: list[dict]):
    """(record, the resume record of its launch or None) for every reset and every launch but the first."""
    resumed = None
    launches = 0
    for event in events:
        if event["event"] == "resume":
            resumed = event
        elif event["event"] == "start":
            launches += 1
            if launches > 1:
                yield event, resumed
            resumed = None
        elif event["event"] == "reset":
            yield event, None


def _claim(actions: list[dict], used: set[int], boundary: float) -> dict | None:
    """The newest unclaimed action at or before ``boundary``, marked as claimed."""
    for i in range(len(actions) - 1, -1, -1):
        if actions[i]["time"] <= boundary:
            if i in used:
                return None  # an older action cannot cause a later change than a claimed newer one
            used.add(i)
            return actions[i]
    return None


def _kind(record: dict) -> str:
    if record["event"] == "start":
        return "restart"
    if record.get("reason") == "hosts_updated":
        return record.get("hosts") or "mixed"
    return "failure"


def _detail(record: dict, resumed: dict | None) -> str:
    if record["event"] == "start":
        return f"resumed from step {resumed.get('step')} (checkpoint)" if resumed else "from scratch (no checkpoint)"
    # Horovod's messages carry the C++ source path in brackets: noise to a reader.
    return re.sub(r"\[[^\]]*\]\s*", "", record.get("message") or "")


def _size_before(sizes: list[tuple[float, int]], boundary: float) -> int | None:
    before = [s for t, s in sizes if t <= boundary]
    return before[-1] if before else None


def _rolled_back(steps: list[dict], boundary: float, resumed_at: float) -> int | None:
    before = [r["step"] for r in steps if r["time"] <= boundary]
    after = next((r["step"] for r in steps if r["time"] >= resumed_at), None)
    if not before or after is None:
        return None
    return max(0, before[-1] - (after - 1))


def format_table(timeline: Timeline) -> str:
    """The timeline as a fixed-width text table, one row per change (relative times in seconds)."""
    t0 = timeline.start or 0.0
    lines = [f"{'t (s)':>7}  {'cause':<26} {'change':<9} {'size':<7} {'recovery':>8} {'pause':>7} "
             f"{'rolled back':>11}  detail"]
    if timeline.first_size is not None:
        lines.append(f"{0.0:>7.1f}  {'-':<26} {'launch':<9} {'- -> ' + str(timeline.first_size):<7} "
                     f"{'-':>8} {'-':>7} {'-':>11}")
    for c in timeline.changes:
        cause = f"{c.cause['action']} {c.cause.get('host') or ''}".strip() if c.cause else "-"
        at = c.cause["time"] if c.cause else c.time
        size = f"{'?' if c.old_size is None else c.old_size} -> {c.new_size}"
        recovery = "pending" if c.recovery_s is None else f"{c.recovery_s:.1f} s"
        rolled = "-" if c.rolled_back is None else f"{c.rolled_back} steps"
        pause = "-" if c.pause_s is None else f"{c.pause_s:.1f} s"
        lines.append(f"{at - t0:>7.1f}  {cause:<26} {c.kind:<9} {size:<7} {recovery:>8} {pause:>7} {rolled:>11}  "
                     f"{c.detail[:60]}")
    for a in timeline.idle_actions:
        lines.append(f"{a['time'] - t0:>7.1f}  {(a['action'] + ' ' + (a.get('host') or '')).strip():<26} "
                     f"{'none':<9} {'':<7} {'-':>8} {'-':>7} {'-':>11}  no membership change followed")
    return "\n".join(lines)
