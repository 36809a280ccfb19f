"""The ``run`` decorator: Horovod's elastic loop plus durable checkpoints and an event log.

::

    @hvd_elastic.run(checkpoint_dir="ckpt", checkpoint_every_commits=100, event_log="events.jsonl")
    def train(state):
        while state.step < total_steps:
            ...
            state.step += 1
            state.commit()

    hvd.init()
    train(TrainingState(model=model, optimizer=optimizer, ...))

Each call of the decorated function:

1. Before every sync of the state (the first world, every world a process joins,
   every world after a failure), checks that every rank sees the same
   ``checkpoint_dir`` (:mod:`hvd_elastic.training._internal.shared_dir`: rank 0 writes a
   marker, every rank reads it back, the outcomes are allgathered), and raises
   :class:`~hvd_elastic.training._internal.shared_dir.SharedDirError` on every rank, naming the
   hosts that do not see it, unless ``checkpoint_dir_shared=False`` or
   ``HVD_ELASTIC_CHECKPOINT_LOCAL=1`` on rank 0 says the directory is local on purpose.
   Then, at this process's first sync, rank 0 deletes leftovers of interrupted
   checkpoint writes and loads the newest valid checkpoint into the state
   (``state.load_snapshot``), so a job that lost every process resumes where its last
   durable checkpoint left it.  The other ranks receive it through that sync, which
   runs before the function.
2. Listens to the state: every commit may start a background checkpoint write (rank 0
   only); commits, syncs and restores go to the event log.
3. Under an elastic launch (``HOROVOD_ELASTIC=1``, set by ``horovodrun --min-np/--max-np
   /--host-discovery-script``) runs the function inside Horovod's elastic loop (see
   :mod:`hvd_elastic.training._internal.elastic_loop` for the one change), and logs
   every reset with its reason and the world size before and after.  Under a static
   launch (``horovodrun -np N``, ``mpirun``) there is nothing to recover to, so it syncs
   once and calls the function; any error ends the job as usual.
4. Measures every rank's own work per step and, once per window of commits, gathers the
   figures in one small allgather and judges each host against the job's median
   (:mod:`hvd_elastic.training._internal.pace`): a host slow in several windows in a row
   is a straggler, reported by rank 0 as a ``straggler`` event and a warning (policy
   ``report``, the default; ``off`` measures nothing).  Under policy ``drain`` rank 0
   also asks the slow host's node agent, through Consul, to drain it (one host per
   window, never below ``--min-np``: :mod:`hvd_elastic.training._internal.straggler_drain`),
   and the node agent readmits it after a cool-down.  Rank 0's policy, handed to every
   rank at each sync, decides for all.
5. Keeps the job's Prometheus metrics on every rank (:mod:`hvd_elastic.metrics.job`:
   world size, resets by cause and their phases, steps, commits, syncs, checkpoints),
   hands rank 0's numbers to every rank at each sync (one small object broadcast,
   so a new rank 0 continues the series), and, when ``metrics_addr`` or
   ``HVD_ELASTIC_METRICS_ADDR`` names an address, serves them from rank 0.
6. When the function returns, rank 0 writes a final checkpoint of the last commit (if
   it is newer than the last checkpoint) and waits for writes in flight.  Commit at the
   end of training so that the final state is the committed one.

Rank 0 is the only writer of checkpoints and of the event log: Horovod keeps rank 0 on
the oldest surviving host, so it is the process that saw every reset.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import socket
import time
from typing import Any, Callable

import horovod.torch as hvd
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from prometheus_client import CollectorRegistry

from hvd_elastic.envvars import horovod_hostname
from hvd_elastic.metrics.exporter import Exporter
from hvd_elastic.metrics.job import JobMetrics
from hvd_elastic.training import settings as worker_settings
from hvd_elastic.training._internal import forksafe, objects, pace, rendezvous, shared_dir, straggler_drain
from hvd_elastic.training._internal.compat import HostUpdateResult, notification_manager
from hvd_elastic.training.checkpoint import CheckpointManager, check_policy
from hvd_elastic.training._internal.elastic_loop import run_elastic
from hvd_elastic.training.events import EventLog, describe_error

log = logging.getLogger(__name__)

METRICS_RETRY_S = 5.0

# What checkpointing needs from the state (TrainingState has all of it).
_CHECKPOINT_STATE_API = ("snapshot", "load_snapshot", "add_listener")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Every setting of :func:`run` in one typed place.

    Attributes:
        checkpoint_dir: where rank 0 writes checkpoints and where a restarted job
            resumes from; None disables checkpoints.
        checkpoint_every_commits: write at every N-th commit.
        checkpoint_every_seconds: write at the first commit T seconds after the last write.
        keep_last: checkpoints kept on disk.
        checkpoint_on_exit: write the last commit when the function returns.
        event_log: JSON-lines file rank 0 appends events to; None disables it.
        log_commits: also log every commit (one short line each).
        progress_log: JSON-lines file rank 0 appends one row to at every commit:
            ``time``, ``size``, ``commit_count``, ``step`` (the state's ``step``
            value, else the commit count) and every other number among the
            state's user values (declare ``loss=0.0`` and set ``state.loss``
            before the commit to log it); what ``hvd-elastic report`` draws.
            None writes none.
        fresh_start_if_unreadable: when ``checkpoint_dir`` holds checkpoints and
            none of them loads, start from scratch instead of stopping with
            :class:`~hvd_elastic.training.checkpoint.UnreadableCheckpoints`.
        checkpoint_dir_shared: every rank must see the same ``checkpoint_dir`` (a
            shared file system), checked before every sync; False when it is local on
            purpose (a single host; checkpoints copied elsewhere by other means), as
            ``HVD_ELASTIC_CHECKPOINT_LOCAL=1`` does.  Rank 0's setting decides.
        metrics_addr: ``[HOST]:PORT`` where rank 0 serves the job's Prometheus
            metrics (a bare port binds loopback); None reads ``HVD_ELASTIC_METRICS_ADDR``,
            and metrics are not served when that is unset or empty.  A bad address
            or a port in use is logged in one line and training goes on.
        straggler: what to do about a straggler, a host whose own work per step
            (its time outside the gradient allreduce's wait) stays well above the
            job's median: ``"report"`` (a ``straggler`` event, a warning, the
            ``hvd_elastic_host_relative_speed`` gauge; never an action), ``"drain"``
            (the same, and the slowest straggler of a window is drained through its
            node agent, which readmits it after a cool-down; a
            ``straggler_drain`` event says what became of it) or ``"off"`` (nothing
            measured).  None reads ``HVD_ELASTIC_STRAGGLER`` (default ``report``: it
            costs one small allgather per window and cannot hurt a job; ``drain``
            changes the job's membership, which its owner opts into).  Rank 0's
            setting decides.
        straggler_threshold: a host is slow in a window when its median own work is
            at least this many times the job's median (and beyond the ranks'
            spread); > 1.  None reads ``HVD_ELASTIC_STRAGGLER_THRESHOLD`` (1.5).
        straggler_window: commits per window; the figures are gathered once per
            window.  None reads ``HVD_ELASTIC_STRAGGLER_WINDOW`` (50).
        straggler_windows: windows in a row a host must be slow in to be reported
            (once per streak).  None reads ``HVD_ELASTIC_STRAGGLER_WINDOWS`` (3).

    Raises:
        ValueError: a checkpoint setting that makes no sense; a
            :class:`~hvd_elastic.envvars.ConfigError` (one line naming the field and
            its value) for a straggler setting: a policy other than ``report``, ``drain`` or ``off``,
            a threshold <= 1, a window or windows < 1.
    """

    checkpoint_dir: str | os.PathLike | None = None
    checkpoint_every_commits: int | None = None
    checkpoint_every_seconds: float | None = None
    keep_last: int = 3
    checkpoint_on_exit: bool = True
    event_log: str | os.PathLike | None = None
    log_commits: bool = True
    progress_log: str | os.PathLike | None = None
    fresh_start_if_unreadable: bool = False
    checkpoint_dir_shared: bool = True
    metrics_addr: str | None = None
    straggler: str | None = None
    straggler_threshold: float | None = None
    straggler_window: int | None = None
    straggler_windows: int | None = None

    def __post_init__(self) -> None:
        pace.check_given(self.straggler_settings())
        if not isinstance(self.checkpoint_dir_shared, bool):
            raise ValueError(f"checkpoint_dir_shared must be True or False, got {self.checkpoint_dir_shared!r}")
        if self.checkpoint_dir is None and (self.checkpoint_every_commits or self.checkpoint_every_seconds):
            raise ValueError("checkpoint_every_commits/checkpoint_every_seconds need a checkpoint_dir")
        check_policy(self.checkpoint_every_commits, self.checkpoint_every_seconds, self.keep_last)

    def straggler_settings(self) -> dict[str, Any]:
        """The ``straggler*`` fields by name (None: read from the variable)."""
        return {name: getattr(self, name) for name in pace.FIELDS}

    def checkpoint_manager(self, state, on_event: Callable[[str, dict], None]) -> CheckpointManager | None:
        """The manager for ``state``: copies are taken in the writer thread under the
        state's ``snapshot_lock`` when it has one (TrainingState does)."""
        if self.checkpoint_dir is None:
            return None
        return CheckpointManager(self.checkpoint_dir, every_commits=self.checkpoint_every_commits,
                                 every_seconds=self.checkpoint_every_seconds, keep_last=self.keep_last,
                                 on_event=on_event, lock=getattr(state, "snapshot_lock", None),
                                 describe=_describe_snapshot)


def run(func: Callable | None = None, /, *, config: RunConfig | None = None, **settings: Any):
    """Decorate a training function ``func(state, *args, **kwargs)``: elastic, checkpointed, logged.

    Use as ``@run``, ``@run(config=RunConfig(...))`` or ``@run(**RunConfig fields)``, for example
    ``@run(checkpoint_dir="/shared/run1/ckpt", checkpoint_every_commits=20, event_log="/shared/run1/events.jsonl")``;
    the settings are the fields of :class:`RunConfig`, checked when the decorator is applied.  Call the
    decorated function with a :class:`~hvd_elastic.training.state.TrainingState` (``hvd.init()`` first, or
    the call does it).  Under an elastic ``horovodrun`` (``--min-np``/``--max-np``/``--host-discovery-script``)
    it runs inside Horovod's elastic loop: a failed collective rolls the state back to its last commit, a
    change of hosts takes effect at the next commit, and the function is called again after each reset.
    Before every sync every rank must see the same ``checkpoint_dir`` (else ``SharedDirError`` on every
    rank); at the first sync rank 0 resumes from the newest valid checkpoint there.  Rank 0 writes
    checkpoints in the background at the chosen commits and a last one when the function returns, and
    appends to the event log and the progress log.  Returns what the function returns; an exception it
    raises (other than Horovod's resets) is logged as ``abort`` and raised.
    """
    if config is not None and settings:
        raise TypeError("pass either config= or individual settings, not both")
    config = config or RunConfig(**settings)

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(state, *args, **kwargs):
            return _Session(config, state).run(fn, *args, **kwargs)
        return wrapper

    return decorate(func) if func is not None else decorate


def is_elastic_launch() -> bool:
    """Whether this process was started by an elastic horovodrun."""
    return os.environ.get("HOROVOD_ELASTIC") == "1"


class _Session:
    """One call of a decorated function: its checkpoints, events and reset bookkeeping."""

    def __init__(self, config: RunConfig, state) -> None:
        if not hvd.is_initialized():
            hvd.init()
        # A TrainingState read them at its construction; Horovod's own states did not.
        self.settings = getattr(state, "worker_settings", None) or worker_settings.from_environment()
        forksafe.install(self.settings.fork_safety)  # also for Horovod's own states: forked children drop Gloo's
        if config.checkpoint_dir is not None:
            missing = [m for m in _CHECKPOINT_STATE_API if not callable(getattr(state, m, None))]
            if missing:
                raise TypeError(f"checkpoint_dir needs a state with {', '.join(_CHECKPOINT_STATE_API)} "
                                f"(hvd_elastic.TrainingState); {type(state).__name__} lacks {', '.join(missing)}")
        self.config = config
        self.state = state
        self._active = True  # listeners of a finished call go quiet (states keep their listeners)
        self._rank = hvd.rank()
        self._size = hvd.size()
        self._host = horovod_hostname() or socket.gethostname()
        self.events = EventLog(config.event_log, context=self._context) if config.event_log else None
        self.checkpoints = config.checkpoint_manager(state, on_event=self._emit_from_writer)
        self._check_shared = bool(self.checkpoints) and config.checkpoint_dir_shared and \
            not self.settings.checkpoint_local
        # Until this process has completed a sync, the rank 0 of each sync it enters loads the newest
        # checkpoint first: a rank 0 lost during the job's first sync must not leave the next world at step 0.
        self._resumed = False
        # Only commits made during this call need a checkpoint at exit.
        self._last_checkpoint_commit = getattr(state, "commit_count", None)
        self._host_updates = HostUpdateResult.no_update
        self._notified_at: float | None = None  # first host notification since the last reset
        self._pending_reset: dict | None = None
        self._entries = 0
        self.metrics = JobMetrics()
        self._metrics_source = "metrics_addr" if config.metrics_addr is not None else worker_settings.METRICS_ADDR_ENV
        self._metrics_addr = (config.metrics_addr if config.metrics_addr is not None
                              else self.settings.metrics_addr).strip()
        self._exporter: Exporter | None = None
        self._metrics_retry_at: float | None = None
        self._committed_step = getattr(state, "step", None)
        self._step_at_error = None
        self._announced = False  # horovodrun's driver rules know a durable checkpoint exists
        # This process's straggler policy: what it offers as rank 0; every rank runs rank 0's (see _before_sync).
        self._pace_policy = pace.PacePolicy.resolve(config.straggler_settings(), self.settings)
        self._pace = pace.Pace(self._pace_policy)
        self._streaks = pace.Streaks(self._pace_policy.windows)
        self._drainer = straggler_drain.Drainer()  # rank 0's, policy drain
        self._paced = False  # the state tells us its commits (a TrainingState): there is something to time
        if self.checkpoints is not None and self.checkpoints.checkpoints():
            self._announce_resumable()  # a relaunched job can resume before its first sync has loaded one

    # -------------------------------------------------------------- the call

    def run(self, fn: Callable, *args, **kwargs):
        elastic = is_elastic_launch()
        if elastic:
            notification_manager.register_listener(self)
        try:
            add_listener = getattr(self.state, "add_listener", None)
            if add_listener is not None:  # Horovod's own states have none: resets are still logged
                add_listener(self._on_state_event)
                self._paced = True
                self._adopt_pace(self._pace_policy)  # until a sync hands over rank 0's

            def inner(state):  # the function's own arguments never meet run_elastic's keywords
                return self._call(fn, state, *args, **kwargs)

            if elastic:
                result = run_elastic(inner, self.state, before_sync=self._before_sync, settings=self.settings)
            else:
                self._before_sync()
                self.state.sync()
                result = inner(self.state)
            self._finish()
            return result
        except BaseException as exc:
            self._emit("abort", error=describe_error(exc))
            raise
        finally:
            self._active = False
            self._pace.waits.unwatch()
            if self._exporter is not None:
                self._exporter.stop()
            if elastic:
                notification_manager.remove_listener(self)
            if self.checkpoints is not None:
                self.checkpoints.close()
            if self.events is not None:
                self.events.close()

    def _call(self, fn: Callable, state, *args, **kwargs):
        self._resumed = True  # a sync completed: this process holds the job's state from now on
        self._refresh_rank()
        self._entries += 1
        self._pace.restart()  # a new world (or the same after a failure): every rank's windows start over
        self._drainer.new_world()
        self.metrics.on_world(self._rank, self._size)
        self._serve_metrics()
        if self._entries == 1:
            self._emit("start")
        else:
            # No record means the error came from the state's sync, outside the function.
            reset = self._pending_reset or {"reason": "internal_error", "message": "failed during sync",
                                            "old_size": None}
            self.metrics.on_reset_begun(self._pending_reset)  # a no-op when the sync before began it
            self.metrics.on_resumed()
            self._emit("reset", **reset, new_size=self._size)
            self._pending_reset = None
            self._host_updates = HostUpdateResult.no_update
            self._notified_at = None
        try:
            return fn(state, *args, **kwargs)
        except HostsUpdatedInterrupt as exc:
            self._pending_reset = {"reason": "hosts_updated", "hosts": self._describe_hosts(exc),
                                   "old_size": self._size, "notified_at": self._notified_at,
                                   "interrupted_at": time.time(),
                                   "joined_ahead": getattr(exc, "answer", None) is not None}
            raise
        except HorovodInternalError as exc:
            self._step_at_error = getattr(state, "step", None)  # what a restore is about to roll back
            self._pending_reset = {"reason": "internal_error", "message": describe_error(exc), "old_size": self._size,
                                   "interrupted_at": time.time()}
            raise

    def _before_sync(self) -> None:
        """Collective, on every rank before every sync: the directory check, (first time) the resume, the metrics.

        Rank 0's news travel in one broadcast: the directory check's marker and, unless a resume
        from a checkpoint is still to come (it changes them), the job's metrics.
        """
        if self._entries:  # this process trained before: a reset is under way (a joiner's first sync is none)
            self.metrics.on_reset_begun(self._pending_reset)
        self._refresh_rank()
        resume_due = self.checkpoints is not None and not self._resumed
        checked = self.checkpoints if self._rank == 0 else None  # rank 0 announces the directory it checks
        with (shared_dir.announced(checked.directory, enabled=self._check_shared) if checked is not None
              else contextlib.nullcontext()) as header:
            news = {"shared_dir": header} if checked is not None else {}
            if self._rank == 0:
                news["pace"] = dataclasses.asdict(self._pace_policy)
            if self._rank == 0 and not resume_due:
                news["metrics"] = self.metrics.carry()
            news = objects.broadcast_object(news, root_rank=0, name="hvd_elastic.before_sync")
            if self.checkpoints is not None:
                # Before the load: a rank 0 that sees another directory than the others must not resume from it.
                shared_dir.confirm(self.checkpoints.directory, news["shared_dir"])
        self._adopt_pace(pace.PacePolicy(**news["pace"]))
        if resume_due:
            self._resume()
        # On every rank whether or not it serves: a collective must never depend on a setting.
        carried = news["metrics"] if "metrics" in news else objects.broadcast_object(
            self.metrics.carry(), root_rank=0, name="hvd_elastic.metrics")
        self.metrics.adopt(carried)

    def _resume(self) -> None:
        if self.checkpoints is None or self._rank != 0:
            return
        self.checkpoints.remove_stale()
        ckpt = self.checkpoints.load_latest(fresh_start_if_unreadable=self.config.fresh_start_if_unreadable)
        if ckpt is None:
            return
        self.state.load_snapshot(ckpt.snapshot)
        self.metrics.on_restart()
        self._committed_step = getattr(self.state, "step", None)
        m = ckpt.manifest
        # Already durable: nothing to write at exit unless training commits again.
        self._last_checkpoint_commit = self.state.commit_count
        log.info("resumed from checkpoint %s (step %s)", ckpt.manifest_path, m.get("step"))
        self._announce_resumable()
        self._emit("resume", path=str(ckpt.manifest_path), sequence=m.get("sequence"), step=m.get("step"),
                   epoch=m.get("epoch"), commit_count=m.get("commit_count"), world_size=m.get("world_size"))

    def _finish(self) -> None:
        self._refresh_rank()
        if self.checkpoints is not None:
            # A periodic write may still be in flight: let it land (and log) first,
            # so "finish" is the last event and the check below sees its outcome.
            self.checkpoints.flush()
        if (self.checkpoints is not None and self.config.checkpoint_on_exit and self._rank == 0
                and (self.state.commit_count != self._last_checkpoint_commit
                     or self.checkpoints.last_error is not None)):
            self.metrics.on_checkpoint_started()
            self.checkpoints.save(self.state.snapshot, **self._manifest_meta())
        self._emit("finish", commit_count=self.state.commit_count)

    # -------------------------------------------------------------- listeners

    def _on_state_event(self, event: str, fields: dict) -> None:
        if not self._active:
            return
        if event == "committed":  # not logged: the end of the commit's host check, where a step's own work begins
            if self._pace.policy.on:
                self._pace.resume()
            return
        # First: this listener's work (and the host check after it) is no step's own work ("committed" above).
        timed = event == "commit" and self._pace.policy.on  # rank 0's policy: the same on every rank
        closed = self._pace.lap(getattr(self.state, "sampler", None)) if timed else None
        self._refresh_rank()
        self._measure(event, fields)
        if event == "commit" and self.checkpoints is not None and self._rank == 0:
            meta = self._manifest_meta()
            if self.checkpoints.commit(self.state.snapshot, **meta):
                self._last_checkpoint_commit = meta["commit_count"]
                self.metrics.on_checkpoint_started()
        if event == "commit" and self.config.progress_log is not None and self._rank == 0:
            self._log_progress(self.config.progress_log, fields.get("commit_count"))
        if event != "commit" or self.config.log_commits:
            self._emit(event, **fields)
        if closed is not None and self._size >= 2:  # the same on every rank: the gather cannot deadlock
            self._judge_pace(closed)

    # -------------------------------------------------------------- stragglers

    def _adopt_pace(self, policy: pace.PacePolicy) -> None:
        """Run ``policy`` from now on (rank 0's, at every sync): when and whether to gather must agree."""
        self._pace.policy = policy
        if self._streaks.windows != policy.windows:
            self._streaks = pace.Streaks(policy.windows)
        if not policy.on or not self._paced:
            self._pace.waits.unwatch()
        elif not self._pace.waits.watching:
            self._pace.waits.watch(getattr(self.state, "optimizer", None))

    def _judge_pace(self, closed: pace.Closed) -> None:
        """Collective, at a window's close on every rank: gather the figures, judge them (every rank alike,
        so a new rank 0 keeps the streaks), and have rank 0 report the window and any new straggler, and
        under policy ``drain`` ask for the slowest one's drain."""
        policy = self._pace.policy
        figures = pace.exchange(self._host, closed.median)
        verdict = pace.judge(figures, policy.threshold)
        stragglers = self._streaks.update(verdict)
        self.metrics.on_pace({host.host: host.speed for host in verdict.hosts}, len(stragglers))
        if verdict.job_median_s is None:
            return
        self._emit("pace", job_median_s=round(verdict.job_median_s, 6), judged=verdict.judged,
                   hosts={h.host: {"s": round(h.seconds, 6), "ratio": round(h.ratio, 3), "ranks": h.ranks,
                                   "slow": h.slow} for h in verdict.hosts})
        if self._rank != 0:
            return
        for host in stragglers:
            self._on_straggler(host, verdict.job_median_s, policy)
        slowest = straggler_drain.choose(stragglers)
        if policy.mode == "drain" and slowest is not None:
            self._drain(slowest, verdict.job_median_s, len({host for host, _ in figures}), policy)

    def _on_straggler(self, host: pace.HostPace, job_median_s: float, policy: pace.PacePolicy) -> None:
        """Rank 0: ``host`` was slow in ``policy.windows`` windows in a row; say so."""
        action = "asking for its drain" if policy.mode == "drain" else "nothing is done about it"
        log.warning("straggler: host %s takes %.2fx the job's median own work per step (%.4f s vs %.4f s) in "
                    "%d windows of %d commits in a row; policy %s: %s", host.host, host.ratio, host.seconds,
                    job_median_s, policy.windows, policy.window, policy.mode, action)
        # The slow host is ``slow_host``: ``host`` is already the writer's own in every record.
        self._emit("straggler", slow_host=host.host, ratio=round(host.ratio, 3), host_s=round(host.seconds, 6),
                   job_median_s=round(job_median_s, 6), ranks=host.ranks, windows=policy.windows,
                   window=policy.window, policy=policy.mode)

    def _drain(self, host: pace.HostPace, job_median_s: float, hosts: int, policy: pace.PacePolicy) -> None:
        """Rank 0, policy ``drain``: ask for ``host``'s drain within the limits (:mod:`.straggler_drain`)."""
        outcome = self._drainer.drain(host, job_median_s, self._size, hosts, policy)
        if outcome.status == straggler_drain.REQUESTED:
            self.metrics.on_straggler_drain()
            log.warning("straggler: asked the node agent of %s (%s) to drain it", host.host,
                        ", ".join(outcome.instances))
        elif outcome.status == straggler_drain.REFUSED:
            log.warning("straggler: Consul refused the drain of %s (%s); this job only reports stragglers from now "
                        "on", host.host, outcome.why)
        else:
            log.warning("straggler: %s is not drained: %s", host.host, outcome.why)
        self._emit("straggler_drain", slow_host=host.host, status=outcome.status, why=outcome.why,
                   instances=list(outcome.instances))

    def _log_progress(self, path: str | os.PathLike, commit_count: int | None) -> None:
        values = getattr(self.state, "values", None) or {}
        numbers = {k: v for k, v in values.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        row = {"time": time.time(), "size": hvd.size(), "commit_count": commit_count,
               "step": numbers.pop("step", commit_count), **numbers}
        # One short line per O_APPEND write: whole rows, whichever process is rank 0 now.
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def _measure(self, event: str, fields: dict) -> None:
        """Feed the job's metrics from one of the state's events (every rank)."""
        if event == "commit":
            self._committed_step = getattr(self.state, "step", None)
            self.metrics.on_commit(fields.get("seconds", 0.0), self._committed_step, _sample_position(self.state))
            if self._metrics_retry_at is not None and time.monotonic() >= self._metrics_retry_at:
                self._serve_metrics()
        elif event == "sync":
            self.metrics.on_sync(fields.get("seconds", 0.0), fields.get("bytes", 0))
            self._committed_step = getattr(self.state, "step", None)
        elif event == "restore":
            self.metrics.on_restore(self._step_at_error, self._committed_step)
            self._step_at_error = None

    def _serve_metrics(self) -> None:
        """Rank 0 serves the job's metrics (when an address is set); a process that is no longer rank 0 stops.

        A port still held (the previous rank 0 on the same machine has not exited yet) is tried again
        at a commit every ``METRICS_RETRY_S``; the exporter logs each reason once.
        """
        self._metrics_retry_at = None
        if not self._metrics_addr:
            return
        if self._rank == 0:
            if self._exporter is None:
                registry = CollectorRegistry(auto_describe=True)
                registry.register(self.metrics)
                self._exporter = Exporter(registry, "job")
            if not self._exporter.start(self._metrics_addr, self._metrics_source):
                self._metrics_retry_at = time.monotonic() + METRICS_RETRY_S
        elif self._exporter is not None:
            self._exporter.stop()

    def on_hosts_updated(self, timestamp, update_res) -> None:
        """Horovod's worker notification (coordinator only): remember what changed, and since when."""
        self._host_updates |= update_res
        if self._notified_at is None:
            self._notified_at = time.time()

    def _describe_hosts(self, exc: HostsUpdatedInterrupt) -> str:
        names = {HostUpdateResult.added: "added", HostUpdateResult.removed: "removed",
                 HostUpdateResult.mixed: "mixed"}
        if self._host_updates in names:
            return names[self._host_updates]
        # Only the coordinator hears the details; the others know removal-only from skip_sync.
        return "removed" if exc.skip_sync else "added"

    # -------------------------------------------------------------- helpers

    def _manifest_meta(self) -> dict:
        return {"step": getattr(self.state, "step", None), "epoch": getattr(self.state, "epoch", None),
                "commit_count": self.state.commit_count, "world_size": self._size}

    def _refresh_rank(self) -> None:
        try:
            self._rank, self._size = hvd.rank(), hvd.size()
        except ValueError:
            pass  # between Horovod's shutdown and init during a reset: keep the last known

    def _context(self) -> dict:
        return {"rank": self._rank, "size": self._size, "host": self._host, "pid": os.getpid()}

    def _emit(self, event: str, **fields: Any) -> None:
        if self.events is not None and self._rank == 0:
            self.events.emit(event, **fields)

    def _emit_from_writer(self, event: str, fields: dict) -> None:
        # The checkpoint writer only runs on a process that was rank 0 when it started.
        if event in ("checkpoint", "checkpoint_error"):
            self.metrics.on_checkpoint(event == "checkpoint", fields.get("seconds"), fields.get("step"))
        if event == "checkpoint":
            self._announce_resumable()
        if self.events is not None:
            self.events.emit(event, **fields)

    def _announce_resumable(self) -> None:
        """Once per process: tell horovodrun's driver that a round in which every worker fails can resume
        from a checkpoint instead of ending the job (:mod:`hvd_elastic.horovodrun.rules`)."""
        server = None if self._announced else rendezvous.Server.from_env()
        if server is None:
            return
        try:
            server.announce_resumable()
            self._announced = True
        except rendezvous.ERRORS as exc:  # the driver may be re-forming the world: the next checkpoint retries
            log.debug("could not announce the checkpoint to horovodrun's driver: %s", exc)


def _sample_position(state) -> int | None:
    """Samples the state's sampler has passed since its epoch 0 (``epoch * num_samples + offset``), or None."""
    sampler: Any = getattr(state, "sampler", None)  # None, or one without these, ends in the except
    try:
        return int(sampler.epoch) * int(sampler.num_samples) + int(sampler.offset)
    except (AttributeError, TypeError, ValueError):
        return None


def _describe_snapshot(snapshot: Any) -> dict:
    """Manifest fields read from a TrainingState snapshot: the step and epoch it holds."""
    values = snapshot.get("values") if isinstance(snapshot, dict) else None
    if not isinstance(values, dict):
        return {}
    return {key: values[key] for key in ("step", "epoch") if key in values}
