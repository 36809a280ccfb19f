"""The job's metrics, kept by every rank of ``@hvd_elastic.run`` and served by rank 0.

Every rank keeps the same numbers: they are fed by events every rank sees
(commits, syncs, resets are collective), and at every sync rank 0's numbers
are broadcast to all (:meth:`JobMetrics.carry` / :meth:`JobMetrics.adopt`, one
small ``broadcast_object`` per sync).  So when rank 0's host is lost, the
survivor that becomes rank 0 already holds the job's counters and serves
them on: the series stay continuous, only the scrape target moves (aggregate
over ``instance``, as the README's dashboard does).  A whole-job relaunch starts the counters from zero, which
Prometheus's ``rate``/``increase`` read as a counter reset.

A reset is measured in four phases, each a label of
``hvd_elastic_reset_phase_seconds``, and as a whole in
``hvd_elastic_recovery_seconds`` (observed at the first commit after it):

============== ===============================================================
``detection``  hosts changed: from rank 0's first host notification to the
               interrupt; a failure: from the last commit to the error
               (how long the collective waited before it failed)
``reinit``     from the interrupt to the start of the sync (Horovod's
               shutdown, rendezvous, new workers' start-up, ``hvd.init``)
``sync``       the state's sync
``first_step`` from the end of the sync to the first commit
============== ===============================================================
"""

from __future__ import annotations

import threading
import time
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from hvd_elastic.metrics.histogram import COPY_BUCKETS, RECOVERY_BUCKETS, Histogram

#: ``hvd_elastic_resets_total{cause}``: why the world was rebuilt.
CAUSES = ("hosts_added", "hosts_removed", "hosts_mixed", "failure", "restart")
PHASES = ("detection", "reinit", "sync", "first_step")
_HOSTS_CAUSE = {"added": "hosts_added", "removed": "hosts_removed", "mixed": "hosts_mixed"}

# Counters carried between ranks, with their help text.
_COUNTERS = {
    "steps": "Training steps committed.",
    "samples": "Samples committed (from the state's ExactlyOnceSampler).",
    "commits": "Commits of the training state.",
    "steps_rolled_back": "Steps trained but lost to a restore (work done after the last commit).",
    "not_training_seconds": "Seconds between an interrupt and the first commit after it.",
    "sync_bytes": "Bytes of state synchronised from rank 0 after resets.",
    "checkpoints_started": "Checkpoint writes started.",
    "stragglers_reported": "Hosts reported as stragglers (slow in several windows in a row), once per streak.",
    "stragglers_drained": "Straggler drains asked of a node agent (straggler policy drain).",
}


def cause_of(reset: dict) -> str:
    """The ``cause`` label for one of the runner's reset records (``reason``, ``hosts``)."""
    if reset.get("reason") == "hosts_updated":
        return _HOSTS_CAUSE.get(reset.get("hosts", "mixed"), "hosts_mixed")  # unnamed hosts: mixed too
    return "failure"


class JobMetrics(Collector):
    """The numbers behind the job's series, and the collector that renders them.

    Fed through the ``on_*`` methods from the training thread and the
    checkpoint writer; rendered by :meth:`collect` from the exporter's thread.
    Every method holds the lock for a few dictionary updates only.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.world_size = 0
        self.rank = -1
        self.counters = dict.fromkeys(_COUNTERS, 0)
        self.resets = dict.fromkeys(CAUSES, 0)
        self.checkpoint_writes = {"ok": 0, "error": 0}
        self.size_seen = {"min": 0, "max": 0}
        self.checkpoint: dict[str, float | None] = {"step": None, "time": None}
        self.phases = {phase: Histogram(RECOVERY_BUCKETS) for phase in PHASES}
        self.recovery = Histogram(RECOVERY_BUCKETS)
        self.durations = {what: Histogram(COPY_BUCKETS if what != "checkpoint_write" else RECOVERY_BUCKETS)
                          for what in ("commit", "sync", "checkpoint_write")}
        self.open_reset: dict | None = None  # begun, not yet ended by a commit
        self._last_commit_at: float | None = None
        self._position: dict[str, int | None] = {"steps": None, "samples": None}
        # Not carried: every rank computes them from the same gathered figures at each window's close.
        self.host_speed: dict[str, float] = {}

    # -------------------------------------------------------------- carried between ranks

    def carry(self) -> dict:
        """Everything rank 0 hands the other ranks at a sync (plain, picklable)."""
        with self._lock:
            return {"counters": dict(self.counters), "resets": dict(self.resets),
                    "checkpoint_writes": dict(self.checkpoint_writes), "size_seen": dict(self.size_seen),
                    "checkpoint": dict(self.checkpoint), "open_reset": dict(self.open_reset or {}) or None,
                    "position": dict(self._position),
                    "phases": {k: h.to_dict() for k, h in self.phases.items()}, "recovery": self.recovery.to_dict(),
                    "durations": {k: h.to_dict() for k, h in self.durations.items()}}

    def adopt(self, carried: Any) -> None:
        """Take rank 0's :meth:`carry`, its step and sample position included (the sync makes them this rank's)."""
        if not isinstance(carried, dict):
            return
        with self._lock:
            for name, mine in (("counters", self.counters), ("resets", self.resets),
                               ("checkpoint_writes", self.checkpoint_writes), ("size_seen", self.size_seen),
                               ("checkpoint", self.checkpoint), ("position", self._position)):
                theirs = carried.get(name) or {}
                mine.update({k: theirs[k] for k in mine if k in theirs})
            self.open_reset = carried.get("open_reset") or None
            self.recovery.load(carried.get("recovery"))
            for group, hists in (("phases", self.phases), ("durations", self.durations)):
                for name, hist in hists.items():
                    hist.load((carried.get(group) or {}).get(name))

    # -------------------------------------------------------------- fed by the runner

    def on_world(self, rank: int, size: int) -> None:
        with self._lock:
            self.rank, self.world_size = rank, size
            low, high = self.size_seen["min"], self.size_seen["max"]
            self.size_seen = {"min": min(low, size) if low else size, "max": max(high, size)}

    def on_reset_begun(self, reset: dict | None, now: float | None = None) -> None:
        """A reset is under way (before its sync): ``reset`` is the runner's record, None after a failed sync.

        Idempotent while a reset is open: a failed sync retried is the same recovery.
        """
        now = time.time() if now is None else now
        with self._lock:
            if self.open_reset is not None:
                return
            reset = reset or {"reason": "internal_error"}
            interrupted = reset.get("interrupted_at") or now
            if reset.get("reason") == "hosts_updated":
                since = reset.get("notified_at") or interrupted
            else:
                since = self._last_commit_at or interrupted
            cause = cause_of(reset)
            self.resets[cause] += 1
            self.open_reset = {"cause": cause, "since": min(since, interrupted), "interrupted_at": interrupted}

    def on_restart(self) -> None:
        """The job was relaunched and resumed from a checkpoint (rank 0, before the first sync)."""
        with self._lock:
            self.resets["restart"] += 1

    def on_sync(self, seconds: float, nbytes: int, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._lock:
            self.durations["sync"].observe(seconds)
            self.counters["sync_bytes"] += int(nbytes or 0)
            if self.open_reset is not None:
                self.open_reset["sync_start"] = now - seconds
                self.open_reset["sync_end"] = now

    def on_resumed(self, now: float | None = None) -> None:
        """Training resumes after a reset; one without a sync (every rank kept its state) ends its reinit here."""
        now = time.time() if now is None else now
        with self._lock:
            if self.open_reset is not None:
                self.open_reset.setdefault("sync_start", now)
                self.open_reset.setdefault("sync_end", now)

    def on_restore(self, live_step: Any, committed_step: Any) -> None:
        if isinstance(live_step, int) and isinstance(committed_step, int) and live_step > committed_step:
            with self._lock:
                self.counters["steps_rolled_back"] += live_step - committed_step

    def on_commit(self, seconds: float, step: Any = None, samples: Any = None, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._lock:
            self.counters["commits"] += 1
            self.durations["commit"].observe(seconds)
            for name, value in (("steps", step), ("samples", samples)):
                last = self._position[name]
                if isinstance(value, int):
                    if isinstance(last, int) and value > last:
                        self.counters[name] += value - last
                    self._position[name] = value
            self._last_commit_at = now
            if self.open_reset is not None:
                self._end_reset(self.open_reset, now)
                self.open_reset = None

    def on_pace(self, speeds: dict[str, float], stragglers: int) -> None:
        """A straggler window closed: each host's relative speed (the job's median own work over its own: 1
        typical, 0.33 three times slower; hosts not in it are dropped) and the stragglers it reported."""
        with self._lock:
            self.host_speed = dict(speeds)
            self.counters["stragglers_reported"] += int(stragglers)

    def on_straggler_drain(self) -> None:
        """Rank 0 asked a straggler's node agent to drain it."""
        with self._lock:
            self.counters["stragglers_drained"] += 1

    def on_checkpoint_started(self) -> None:
        with self._lock:
            self.counters["checkpoints_started"] += 1

    def on_checkpoint(self, ok: bool, seconds: Any = None, step: Any = None, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._lock:
            self.checkpoint_writes["ok" if ok else "error"] += 1
            if isinstance(seconds, (int, float)):
                self.durations["checkpoint_write"].observe(float(seconds))
            if ok:
                self.checkpoint = {"step": step if isinstance(step, int) else None, "time": now}

    def _end_reset(self, reset: dict, now: float) -> None:
        interrupted = reset["interrupted_at"]
        sync_start = reset.get("sync_start", interrupted)
        sync_end = reset.get("sync_end", sync_start)
        spans = {"detection": interrupted - reset["since"], "reinit": sync_start - interrupted,
                 "sync": sync_end - sync_start, "first_step": now - sync_end}
        for phase, seconds in spans.items():
            self.phases[phase].observe(max(0.0, seconds))
        total = max(0.0, now - reset["since"])
        self.recovery.observe(total)
        self.counters["not_training_seconds"] += total

    # -------------------------------------------------------------- rendered at scrape time

    def collect(self):
        # Built under the lock, yielded outside it: a consumer that stops half-way (an error while
        # rendering keeps the generator alive in a traceback) must never leave training waiting.
        with self._lock:
            families = list(self._families())
        yield from families

    def _families(self):
        """Every family, from plain numbers; the caller holds the lock."""
        yield _gauge("hvd_elastic_world_size", "Ranks in the current world.", self.world_size)
        seen = GaugeMetricFamily("hvd_elastic_world_size_seen", "Smallest and largest world this job trained in.",
                                 labels=["bound"])
        for bound in ("min", "max"):
            seen.add_metric([bound], self.size_seen[bound])
        yield seen
        yield _gauge("hvd_elastic_rank", "This process's rank (the exporter is rank 0's).", self.rank)
        resets = CounterMetricFamily("hvd_elastic_resets", "Resets of the world, by cause.", labels=["cause"])
        for cause in CAUSES:
            resets.add_metric([cause], self.resets[cause])
        yield resets
        for name, help_text in _COUNTERS.items():
            yield CounterMetricFamily(f"hvd_elastic_{name}", help_text, value=self.counters[name])
        writes = CounterMetricFamily("hvd_elastic_checkpoint_writes", "Checkpoint writes finished, by outcome.",
                                     labels=["outcome"])
        for outcome in ("ok", "error"):
            writes.add_metric([outcome], self.checkpoint_writes[outcome])
        yield writes
        in_flight = self.counters["checkpoints_started"] - sum(self.checkpoint_writes.values())
        yield _gauge("hvd_elastic_checkpoint_write_in_progress", "1 while a checkpoint is being written.",
                     1 if in_flight > 0 else 0)
        if self.checkpoint["time"] is not None:
            yield _gauge("hvd_elastic_checkpoint_timestamp_seconds",
                         "When the newest durable checkpoint was written (Unix time).", self.checkpoint["time"])
        if self.checkpoint["step"] is not None:
            yield _gauge("hvd_elastic_checkpoint_step", "The step of the newest durable checkpoint.",
                         self.checkpoint["step"])
        speed = GaugeMetricFamily("hvd_elastic_host_relative_speed",
                                  "Each host's speed relative to the job's median rank in the last straggler window "
                                  "(its own work per step against the median's: 1 typical, 0.33 three times slower).",
                                  labels=["host"])
        for host, value in sorted(self.host_speed.items()):
            speed.add_metric([host], value)
        yield speed
        yield _gauge("hvd_elastic_resetting", "1 from an interrupt to the first commit after it.",
                     1 if self.open_reset is not None else 0)
        phases = HistogramMetricFamily("hvd_elastic_reset_phase_seconds", "Each phase of a reset.",
                                       labels=["phase"])
        for phase, hist in self.phases.items():
            phases.add_metric([phase], hist.cumulative(), hist.sum)
        yield phases
        yield _histogram("hvd_elastic_recovery_seconds",
                         "From the interrupt (or the failure's last commit) to the first commit after it.",
                         self.recovery)
        for what, help_text in (("commit", "Commit of the training state."),
                                ("sync", "Sync of the training state from rank 0."),
                                ("checkpoint_write", "Writing one checkpoint (in the background).")):
            yield _histogram(f"hvd_elastic_{what}_seconds", help_text, self.durations[what])


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=value)


def _histogram(name: str, help_text: str, hist: Histogram) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, help_text)
    family.add_metric([], hist.cumulative(), hist.sum)
    return family
