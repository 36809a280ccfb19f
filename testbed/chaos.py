"""The chaos soak: one long elastic job on the bed under a seeded random stream of faults.

:class:`Soak` runs :mod:`.worker` (checkpoints, DataLoader workers) under
elastic horovodrun on an :class:`~.multihost.ElasticCluster` and, every
``Exp(mtbf)`` seconds, injects a fault drawn from :data:`FAULTS`: the kinds of
the fault matrix, now overlapping, since a fault may land while the job still
recovers from the one before.  A fault on a host keeps that host *impaired*
until its last follow-up (thaw, heal, reboot...) ran, each after a random hold;
no other fault touches an impaired host.

Contracts:

* **Replayable.** :func:`schedule` draws the schedule (when, which kind) from the
  seed alone; each fault's own choices (victim, holds) come from a generator
  seeded with ``(seed, fault number)``.  Every injection, follow-up and skip is
  appended, with its wall time, to ``<job>/actions.jsonl`` (the file
  ``hvd-elastic report`` pairs with the resets they cause) and to the log.
* **Never silently skipped.** A fault that cannot be injected at its moment
  (no healthy host left above ``--min-np``, no checkpoint write began, no room
  for another host) is logged as ``skip`` with the reason and counted apart.
* **Never impossible by accident.** :class:`SoakConfig` refuses settings under
  which the faults could take the job below ``min_np`` with no spare host,
  unless ``below_min_np`` says that is the point.
* **A dead or stuck job is relaunched, and counted.** Horovod ends the job
  when every worker of one round fails (horovod/horovod#3264: survivors still
  in ``hvd.init()`` when a peer dies abort, so the whole round is failures),
  and after some streams of overlapping failures its driver wedges (horovodrun
  alive, no worker left).  The job runs under ``hvd-elastic launch
  --max-restarts relaunches --stall-timeout stall_timeout`` with its event log
  as the progress file (:mod:`hvd_elastic.commands.launch`), which relaunches it; the
  soak logs each relaunch as ``job-died`` or ``job-stuck`` with the reason.
* **Bounded.** The soak fails (:class:`SoakFailure`, with the job's log tail)
  when the job ends (past ``relaunches``) or no step commits for ``hang_limit``
  seconds (a hang: the message lists every host's processes and their states);
  a fault after which no step commits within ``bound`` is listed as slow.
* **Back to every host.** Once every fault is undone the job should grow back
  to all hosts within ``bound``; when it does not, the summary's ``not_back``
  says so, with what discovery printed (a finding, not part of the verdict).
* **The verdict** (:meth:`Soak.finish`) is the matrix's, on the whole run:
  :func:`hvd_elastic.report.ledger.run_problems`; the recovery figures come from
  :func:`hvd_elastic.report.timeline.build` over the same files.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import itertools
import json
import logging
import math
import random
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil

from hvd_elastic.report.runlog import ACTIONS, read_run
from hvd_elastic.report.timeline import build

from hvd_elastic.local.job import JobError
from hvd_elastic.report.jsonlines import JsonLines
from hvd_elastic.report.ledger import run_problems, verdict

from .multihost import ElasticCluster, TrainingJob
from .netns import LAUNCHER

log = logging.getLogger(__name__)

WORKER = "testbed.worker --out"  # a training worker's command line (and its DataLoader workers')
COOLDOWN = ("--blacklist-cooldown-range", "3", "5")  # without it Horovod blacklists a failed host for good
CHAOS_LOG = "chaos.jsonl"  # the soak's whole log: injections, follow-ups and skips
CHECKPOINT_WAIT_S = 30.0  # how long checkpoint-cut waits for a write to begin before it is skipped
JOB_DIED = "job-died"  # the log's kind for a relaunch by hvd-elastic launch (see Soak._note_relaunches)
JOB_STUCK = "job-stuck"  # ... of a job launch ended for making no progress (--stall-timeout)
DETECT_S = 30.0  # a reset this soon after a fault is the fault's (the TTL, the lost-host cut and Gloo's 30 s fit)
NEW, SPARE = "new", "spare"  # host states of a host-new fault's host: joined, and decommissioned since
MAX_DRAWS = 4  # the schedule is drawn at most this many times per fault asked for


class SoakFailure(AssertionError):
    """The job did not survive: it ended, or it stopped committing steps for ``hang_limit`` seconds."""


@dataclasses.dataclass(frozen=True)
class Fault:
    """One kind of fault.

    ``target``: ``"host"`` (a healthy host, which stays impaired until the
    returned follow-ups ran), ``"member"`` (a healthy host training in the job;
    not impaired afterwards), ``"job"`` (the whole job) or ``"none"``.
    ``leaves``: it takes a host out of the world, so it counts against ``min_np``.
    ``prepare(soak, host)``, if any, raises :class:`Skip` when the fault cannot be
    injected now; ``inject(soak, host)`` then does it (the moment logged as the
    injection) and returns its follow-ups, ``(what, do)`` in order.
    """

    name: str
    target: str
    leaves: bool
    inject: Callable[["Soak", str | None], list[tuple[str, Callable[[], object]]]]
    doc: str
    prepare: Callable[["Soak", str | None], None] | None = None  # raises Skip when it cannot be injected now


class Skip(Exception):
    """This fault cannot be injected now; the message says why."""


def _has_worker(soak: "Soak", host: str) -> None:
    if not soak.cluster.bed.processes(host, WORKER):
        raise Skip(f"no training worker on {host}")


def _worker_kill(soak: "Soak", host: str):
    soak.cluster.bed.crash(host, match=WORKER)
    return []


def _host_crash(soak: "Soak", host: str):
    soak.cluster.bed.crash(host)  # workers, node agent and Consul agent: the machine died
    return [("reboot", lambda: soak.cluster.start_agent(host))]


def _freeze_thaw(soak: "Soak", host: str):
    soak.cluster.bed.freeze(host)
    return [("thaw", lambda: soak.cluster.bed.thaw(host))]


def _freeze_kill(soak: "Soak", host: str):
    bed = soak.cluster.bed
    bed.freeze(host)
    return [("kill", lambda: (bed.crash(host), bed.thaw(host))), ("reboot", lambda: soak.cluster.start_agent(host))]


def _partition(soak: "Soak", host: str):
    soak.cluster.bed.partition(host)
    return [("heal", lambda: soak.cluster.bed.heal(host))]


def _drain(soak: "Soak", host: str):
    soak.cluster.drain(host)
    return [("undrain", lambda: soak.cluster.undrain(host))]


def _agent_death(soak: "Soak", host: str):
    soak.cluster.stop_agent(host)  # SIGKILL: the TTL check expires
    return [("restart agent", lambda: soak.cluster.start_agent(host))]


def _host_leave(soak: "Soak", host: str):
    soak.cluster.agents[host].stop()  # SIGTERM: the node agent deregisters, a graceful decommission
    return [("return", lambda: soak.cluster.start_agent(host))]


def _room_for_a_host(soak: "Soak", host: None) -> None:
    if not soak.spares() and len(soak.cluster.bed.hosts) >= soak.config.max_hosts:
        raise Skip(f"the bed has {len(soak.cluster.bed.hosts)} hosts, the most this soak adds to "
                   f"({soak.config.max_hosts}), and none is a spare")


def _host_new(soak: "Soak", host: None):
    # A spare (a host this soak added and later decommissioned) boots again, else the bed grows by one; either
    # way the host is decommissioned after a hold, so joins keep coming however long the soak runs.
    spares = soak.spares()
    if spares:
        host = soak.rng.choice(spares)
        soak.cluster.start_agent(host)
    else:
        host = soak.cluster.add_host()
    soak.state[host] = NEW
    soak.note["host"] = host
    return [("decommission", lambda: (soak.cluster.agents[host].stop(), SPARE)[1])]


def _pick_consul_agent(soak: "Soak", host: None) -> None:
    # A Consul agent restarts (an upgrade, a crash): the launcher's, where discovery asks, or a healthy host's;
    # with a quorum of servers also the leading server, whose loss is a leader election.  A one-server cluster
    # draws exactly as before, so its soaks replay unchanged.
    leader = [soak.cluster.consul.wait_leader()] if soak.cluster.consul_servers > 1 else []
    soak.note["node"] = soak.rng.choice([LAUNCHER, *soak.healthy(), *leader])


def _consul_restart(soak: "Soak", host: None):
    node, consul = soak.note["node"], soak.cluster.consul
    server = soak.cluster.consul_servers > 1 and node in consul.server_nodes
    (consul.stop_server if server else consul.stop_node)(node)
    time.sleep(soak.rng.uniform(1.0, 5.0))
    (consul.start_server if server else consul.start_node)(node)
    return []


def _job_kill(soak: "Soak", host: None):
    soak.relaunch()
    return []


def _stall_a_checkpoint_write(soak: "Soak", host: None) -> None:
    stall = soak.job.out / "stall-checkpoints"
    torn = set((soak.job.out / "ckpt").glob(".tmp-*"))  # an earlier cut's, until the job cleans them up
    stall.touch()  # the next write stalls before it is durable
    writing = lambda: set((soak.job.out / "ckpt").glob(".tmp-*")) - torn  # noqa: E731
    soak.idle_while(lambda: not writing(), CHECKPOINT_WAIT_S)
    if not writing():
        stall.unlink(missing_ok=True)
        raise Skip(f"no checkpoint write began within {CHECKPOINT_WAIT_S:.0f} s")


def _checkpoint_cut(soak: "Soak", host: None):
    soak.relaunch(before_start=(soak.job.out / "stall-checkpoints").unlink)
    return []


#: Every kind the soak draws from, by name (a registry: a new kind is one entry).
FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault("worker-kill", "member", False, _worker_kill, "SIGKILL one host's training worker", _has_worker),
    Fault("host-crash", "host", True, _host_crash, "SIGKILL every process of a host; reboot later"),
    Fault("freeze-thaw", "host", True, _freeze_thaw, "SIGSTOP a whole host, SIGCONT later"),
    Fault("freeze-kill", "host", True, _freeze_kill, "SIGSTOP a host, later SIGKILL it, later reboot"),
    Fault("partition", "host", True, _partition, "cut a host's link, heal it later"),
    Fault("drain", "host", True, _drain, "hvd-elastic drain, undrain later"),
    Fault("agent-death", "host", True, _agent_death, "SIGKILL the node agent (TTL expiry), restart later"),
    Fault("host-leave", "host", True, _host_leave, "the node agent deregisters (SIGTERM); the host returns later"),
    Fault("host-new", "none", False, _host_new,
          "a new host (or a spare) boots and registers; decommissioned after a hold", _room_for_a_host),
    Fault("consul-restart", "none", False, _consul_restart,
          "a Consul agent (launcher's, a host's or the leading server) restarts", _pick_consul_agent),
    Fault("job-kill", "job", False, _job_kill, "SIGKILL the whole job, relaunch from the newest checkpoint"),
    Fault("checkpoint-cut", "job", False, _checkpoint_cut, "SIGKILL the whole job mid checkpoint write, relaunch",
          _stall_a_checkpoint_write),
)}
#: How often a kind is drawn against the others' 1: capacity comes back as often as it goes, so joins
#: are about one fault in five of the schedule (some are skipped: no room for another host).
WEIGHTS = {"host-new": 3.0}
#: Faults on the whole job, whose change is the next launch.
JOB_FAULTS = {f.name for f in FAULTS.values() if f.target == "job"} | {JOB_DIED, JOB_STUCK}


@dataclasses.dataclass
class SoakConfig:
    """The soak's settings in one place; :meth:`validate` names the first bad one."""

    seed: int
    faults: int = 20
    mtbf: float = 15.0  # mean seconds between injections (exponential gaps)
    kinds: tuple[str, ...] = tuple(FAULTS)
    hosts: int = 4
    max_hosts: int = 5  # host-new adds hosts up to this many
    min_np: int = 2
    max_impaired: int | None = None  # hosts impaired at once; default hosts - min_np
    hold: tuple[float, float] = (3.0, 20.0)  # seconds before each follow-up of a host fault
    bound: float = 150.0  # a fault with no committed step this long after it is listed as slow
    hang_limit: float = 600.0  # no committed step this long: the job hangs, the soak fails
    stall_timeout: float = 180.0  # hvd-elastic launch --stall-timeout: a job this long without a commit is ended
    below_min_np: bool = False  # allow faults to take the job below min_np (it must then wait)
    relaunches: int = 10  # hvd-elastic launch --max-restarts: how often the job may die and be relaunched
    gloo_timeout: int = 30  # Horovod's default
    ttl: float = 3.0
    # The user's plain command as README gives it: horovodrun alone, no blacklist cooldown, no hvd-elastic launch
    # (a job death or a stuck job ends the soak).
    plain: bool = False
    # The job's straggler policy (not in a plain soak, which keeps the default): drain, so any drain in a soak
    # (where no host is slow) is counted as a false one.
    straggler: str = "drain"

    def __post_init__(self):
        if self.max_impaired is None:
            self.max_impaired = self.hosts - self.min_np

    def validate(self) -> "SoakConfig":
        unknown = [k for k in self.kinds if k not in FAULTS]
        if unknown:
            raise ValueError(f"unknown fault kind {unknown[0]!r}, expected some of {', '.join(FAULTS)}")
        for name in ("faults", "hosts", "min_np"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.mtbf > 0:
            raise ValueError(f"mtbf must be > 0 seconds, got {self.mtbf}")
        if not 0 <= self.hold[0] <= self.hold[1]:
            raise ValueError(f"hold must be (low, high) with 0 <= low <= high, got {self.hold}")
        if self.max_hosts < self.hosts:
            raise ValueError(f"max_hosts ({self.max_hosts}) must be >= hosts ({self.hosts})")
        if self.min_np > self.hosts:
            raise ValueError(f"min_np {self.min_np} exceeds the {self.hosts} hosts: the job could never start")
        if self.hosts - self.max_impaired < self.min_np and not self.below_min_np:
            raise ValueError(f"{self.max_impaired} hosts impaired at once would leave {self.hosts - self.max_impaired} "
                             f"of {self.hosts}, below min_np {self.min_np} with no spare (below_min_np / "
                             f"--below-min-np if that is the point)")
        return self


def schedule(config: SoakConfig) -> Iterator[tuple[float, str]]:
    """The schedule, endless: (seconds after the start, fault kind), from the seed alone."""
    rng = random.Random(f"plan:{config.seed}")
    kinds = sorted(config.kinds)
    weights = [WEIGHTS.get(kind, 1.0) for kind in kinds]
    at = 0.0
    while True:
        at += rng.expovariate(1.0 / config.mtbf)
        yield round(at, 3), rng.choices(kinds, weights)[0]


def plan(config: SoakConfig, draws: int) -> list[tuple[float, str]]:
    """The schedule's first ``draws`` entries."""
    return list(itertools.islice(schedule(config), draws))


@dataclasses.dataclass
class FollowUp:
    """What a host fault does next (thaw, heal, reboot...), and when (monotonic seconds)."""

    due: float
    fault: int
    kind: str
    host: str
    what: str
    do: Callable[[], object]


class Soak:
    """One soak on ``cluster`` (already entered, its node agents up); see the module docstring."""

    def __init__(self, cluster: ElasticCluster, config: SoakConfig, out: Path | None = None):
        self.cluster, self.config = cluster, config.validate()
        self.out = Path(out or cluster.workdir / "soak")
        # "up", what impairs it, NEW (joined by host-new: only its decommission touches it) or SPARE (decommissioned)
        self.state: dict[str, str] = {h: "up" for h in cluster.bed.hosts}
        self.followups: list[FollowUp] = []  # due ones first
        self.job: TrainingJob | None = None
        self.rng = random.Random()
        self.note: dict = {}
        self.counts = {"injected": 0, "skipped": 0, "job_deaths": 0}
        self.not_back: dict | None = None  # set when the job did not grow back to every host at the end
        self._launched = time.time()  # the job's newest (re)launch: the stall check counts from it
        self._last_step = 0.0  # wall time of the newest committed step seen
        self._log: tuple[Path | None, int] = (None, 0)  # the job log read so far for hvd-elastic launch's relaunches

    # -- the run ------------------------------------------------------------------

    def start(self) -> TrainingJob:
        """Start the job on every host and wait for it to train at full size."""
        max_np = self.config.max_hosts * self.cluster.slots
        plain = self.config.plain
        self.job = self.cluster.start_job(self.config.min_np, self.config.min_np, max_np, "--num-workers", "1",
                                          "--checkpoint-every", "5", out=self.out,
                                          horovodrun_args=() if plain else COOLDOWN,
                                          max_restarts=None if plain else self.config.relaunches,
                                          stall_timeout=self.config.stall_timeout,
                                          env=None if plain else {"HVD_ELASTIC_STRAGGLER": self.config.straggler})
        self.cluster.wait_steps(self.job, size=len(self.state) * self.cluster.slots, steps=5,
                                timeout=self.config.hang_limit)
        return self.job

    def run(self) -> None:
        """Inject the whole schedule, then undo whatever is still impaired; raises :class:`SoakFailure`."""
        if self.job is None:
            self.start()
        begin = time.monotonic()
        # Draw until ``faults`` were injected: skips do not count, and a schedule that keeps skipping is bounded.
        # The draw after a skip comes at once, so injected faults keep the mean gap asked for.
        skipped = False
        for number, (offset, kind) in enumerate(plan(self.config, MAX_DRAWS * self.config.faults)):
            if self.counts["injected"] == self.config.faults:
                break
            if skipped:
                begin = time.monotonic() - offset
            self.idle_while(lambda: time.monotonic() < begin + offset, offset + self.config.hang_limit)
            skipped = not self.inject(number, kind)
        # The last follow-ups at their own time (a host thawed 20 s after its freeze), then the world at full size.
        self.idle_while(lambda: bool(self.followups), 2 * self.config.hold[1] + self.config.hang_limit)
        while self.followups:
            self._run_followup(self.followups.pop(0))
        # Every host healthy again: the job should grow back to all of them.  One that does not is a finding
        # (what discovery printed is kept with it), not a broken promise of the verdict.
        full = sum(1 for s in self.state.values() if s != SPARE) * self.cluster.slots
        try:
            self.cluster.wait_steps(self.job, size=full, steps=3, since=time.time(), timeout=self.config.bound)
        except JobError:
            if not self.job.running():
                self._job_ended()
            sizes = [r["size"] for r in self.job.progress.rows()[-1:]]
            self.not_back = {"expected": full, "size": sizes[0] if sizes else None,
                             "discovered": self.cluster.discovered()}
            log.warning("the job did not grow back to %d within %.0f s: %s", full, self.config.bound, self.not_back)

    def inject(self, number: int, kind: str) -> bool:
        """Inject fault ``number`` of ``kind`` now; False when it was skipped (logged with the reason)."""
        fault = FAULTS[kind]
        self.rng = random.Random(f"fault:{self.config.seed}:{number}")
        try:
            host = self._victim(fault)
            if fault.prepare is not None:
                fault.prepare(self, host)
            if fault.target == "host":
                self.state[host] = fault.name
            self._act(number, kind, "inject", host, fault.doc)
            for what, do in fault.inject(self, host):
                self._follow(number, kind, host or self.note["host"], what, do)  # a "none" fault names its host
            self.counts["injected"] += 1
            return True
        except Skip as why:
            self.counts["skipped"] += 1
            self._act(number, kind, "skip", None, str(why))
            return False
        finally:
            self.note = {}  # what a fault's prepare noted belongs to that fault's rows only

    def _victim(self, fault: Fault) -> str | None:
        if fault.target in ("none", "job"):
            return None
        healthy = self.healthy()
        if fault.target == "member":
            members = {w["host"] for w in self.cluster.workers(self.job)}
            healthy = [h for h in healthy if h in members]
        impaired = sum(1 for s in self.state.values() if s not in ("up", NEW, SPARE))
        if fault.leaves and impaired >= self.config.max_impaired:
            raise Skip(f"{impaired} hosts impaired already, the most at once ({self.config.max_impaired})")
        if fault.leaves and len(self.healthy()) - 1 < self.config.min_np and not self.config.below_min_np:
            raise Skip(f"{len(self.healthy())} healthy hosts: one fewer is below min_np {self.config.min_np}")
        if not healthy:
            raise Skip("no healthy host runs a training worker" if fault.target == "member"
                       else "no healthy host to inject it on")
        return self.rng.choice(sorted(healthy))

    def healthy(self) -> list[str]:
        return sorted(h for h, s in self.state.items() if s == "up")

    def spares(self) -> list[str]:
        return sorted(h for h, s in self.state.items() if s == SPARE)

    def _follow(self, number: int, kind: str, host: str, what: str, do: Callable[[], object]) -> None:
        after = max([f.due for f in self.followups if f.fault == number], default=time.monotonic())
        self.followups.append(FollowUp(after + self.rng.uniform(*self.config.hold), number, kind, host, what, do))
        self.followups.sort(key=lambda f: f.due)

    def _run_followup(self, followup: FollowUp) -> None:
        self._act(followup.fault, followup.kind, followup.what, followup.host, "")
        after = followup.do()
        if not any(f.fault == followup.fault for f in self.followups):
            self.state[followup.host] = SPARE if after == SPARE else "up"  # its last follow-up ran

    def idle_while(self, waiting: Callable[[], bool], timeout: float) -> None:
        """Run due follow-ups and watch the job while ``waiting()`` holds (at most ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while waiting() and time.monotonic() < deadline:
            while self.followups and self.followups[0].due <= time.monotonic():
                self._run_followup(self.followups.pop(0))
            self._watch()
            time.sleep(0.1)

    def _watch(self) -> None:
        self._note_relaunches()
        if not self.job.running():
            self._job_ended()
        for row in self.job.progress.new_rows():  # only what is new: this runs ten times a second
            self._last_step = row["time"]
        last = self._last_step or self._launched
        if time.time() - max(last, self._launched) > self.config.hang_limit:
            raise SoakFailure(f"no step committed for {self.config.hang_limit:.0f} s (since {last:.1f})\n"
                              f"{self.processes()}\n"
                              f"{self.job.log_tail()}")

    def processes(self) -> str:
        """Every host's processes with their states (what a hang report needs)."""
        lines = []
        for host in [LAUNCHER, *self.cluster.bed.hosts]:
            for proc in self.cluster.bed.processes(host):
                with contextlib.suppress(psutil.Error):
                    lines.append(f"{host} {self.state.get(host, '')} {proc.pid} {proc.status()} "
                                 f"{' '.join(proc.cmdline())[:160]}")
        return "\n".join(lines)

    def _job_ended(self) -> None:
        raise SoakFailure(f"the job ended ({self.job.returncode}) during the soak after {self.counts['job_deaths']} "
                          f"relaunches\n{self.job.log_tail()}")

    def _note_relaunches(self) -> None:
        """Log every relaunch ``hvd-elastic launch`` made since the last look as a ``job-died`` action."""
        log_file = self.job.logs[-1]
        if log_file != self._log[0]:
            self._log = (log_file, 0)
        with open(log_file, "rb") as f:
            f.seek(self._log[1])
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        self._log = (log_file, self._log[1] + len(complete))
        for line in complete.decode(errors="replace").splitlines():
            if "hvd_elastic.launch:" in line and "; relaunch " in line:
                self.counts["job_deaths"] += 1
                self._launched = time.time()
                self._act(-1, JOB_STUCK if "stuck" in line else JOB_DIED, "relaunch", None,
                          line.split("hvd_elastic.launch: ", 1)[-1])

    def relaunch(self, before_start: Callable[[], object] | None = None) -> None:
        """SIGKILL the whole job and start it again (it resumes from its newest durable checkpoint)."""
        self.job.kill()
        if before_start is not None:
            before_start()
        self._launched = time.time()
        self.job.start()

    def _act(self, number: int, kind: str, phase: str, host: str | None, detail: str) -> None:
        """Log one step of fault ``number``: always to ``chaos.jsonl``; to ``actions.jsonl`` unless it is a skip
        (the report pairs every action there with the reset it causes, and a skip causes none)."""
        row = {"time": time.time(), "action": f"{kind} {phase}", "fault": number,
               "kind": kind, "phase": phase, "host": host, "detail": detail, **self.note}
        line = json.dumps(row) + "\n"
        for name in (CHAOS_LOG, *(() if phase == "skip" else (ACTIONS,))):
            with open(self.out / name, "a") as f:
                f.write(line)
        log.info("fault %d %s %s %s %s", number, kind, phase, host or "", detail)

    # -- the verdict ----------------------------------------------------------

    def finish(self) -> dict:
        """Stop the job at an epoch's end; the summary (:func:`summarise`) with every broken promise in ``problems``."""
        self.cluster.stop(self.job, timeout=self.config.hang_limit)
        result = verdict(self.out)
        summary = summarise(self.out, self.config.bound)
        summary["problems"] = run_problems(self.out, result)
        # No host of a soak is slow: a straggler drain there is a false one.
        summary["false_drains"] = [e for e in read_run(self.out).events
                                   if e["event"] == "straggler_drain" and e.get("status") == "requested"]
        summary.update(seed=self.config.seed, mtbf=self.config.mtbf, hosts=self.config.hosts, lost=result.lost,
                       not_back=self.not_back,
                       duplicated=result.duplicated, identical=result.params_identical, epochs=result.epochs,
                       **self.counts)
        return summary


def summarise(out: Path, bound: float) -> dict:
    """Per fault kind: injected, skipped, changes it caused, recovery p50/p90/max (s); the training share.

    A fault's *change* is the first one after it: for a fault on the whole job
    (and a job death) the next launch, for any other the first reset whose
    interruption began within ``DETECT_S`` of the injection.  Its recovery runs
    from the injection to the first step committed after that change, at
    whatever size (faults that overlap may share a change: the job recovered
    from both at once).  A fault without a change was absorbed: its recovery
    is the wait for the next committed step.  ``slow`` lists every fault after
    which no step committed within ``bound`` seconds.
    """
    run = read_run(out)
    steps = sorted(r["time"] for r in run.progress)
    launches = [e["time"] for e in run.events if e["event"] == "start"]
    resets = sorted((e.get("notified_at") or e.get("interrupted_at") or e["time"], e["time"])
                    for e in run.events if e["event"] == "reset")
    kinds: dict[str, dict] = {}
    slow = []
    for action in JsonLines(out / CHAOS_LOG).rows():
        if action["phase"] not in ("inject", "skip", "relaunch"):
            continue
        row = kinds.setdefault(action["kind"], {"injected": 0, "skipped": 0, "changes": 0, "recovery": []})
        if action["phase"] == "skip":
            row["skipped"] += 1
            continue
        row["injected"] += 1
        at = action["time"]
        if action["kind"] in JOB_FAULTS:
            resumed = next((t for t in launches if t > at), None)
        else:
            resumed = next((r for began, r in resets if at <= began <= at + DETECT_S), None)
        row["changes"] += resumed is not None
        after = bisect.bisect_left(steps, resumed or at)
        if after == len(steps) or steps[after] - at > bound:
            slow.append(f"{action['action']}{' ' + action['host'] if action['host'] else ''} at {at:.1f}: "
                        f"no step committed within {bound:.0f} s")
        else:
            row["recovery"].append(steps[after] - at)
    for row in kinds.values():
        row.update(percentiles(row.pop("recovery")))
    timeline = build(run)
    stalled = timeline.stalled_share
    return {"kinds": kinds, "slow": slow,
            "training_share": None if not stalled or not stalled[1] else 1 - stalled[0] / stalled[1],
            "wall_s": stalled[1] if stalled else 0.0, "steps": len(run.progress),
            "rolled_back": sum(c.rolled_back or 0 for c in timeline.changes)}


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50, p90 and max of ``values`` (None for an empty list); inclusive quantiles."""
    if not values:
        return {"p50": None, "p90": None, "max": None, "n": 0}
    cuts = statistics.quantiles(values, n=10, method="inclusive") if len(values) > 1 else [values[0]] * 9
    return {"p50": statistics.median(values), "p90": cuts[8], "max": max(values), "n": len(values)}


def format_summary(summary: dict) -> str:
    """The summary as the table the README and the benchmark print."""
    def s(x):
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1f}"

    lines = [f"{'fault':<16}{'injected':>9}{'skipped':>8}{'changes':>8}{'p50 s':>8}{'p90 s':>8}{'max s':>8}"]
    for kind, row in sorted(summary["kinds"].items()):
        lines.append(f"{kind:<16}{row['injected']:>9}{row['skipped']:>8}{row['changes']:>8}"
                     f"{s(row['p50']):>8}{s(row['p90']):>8}{s(row['max']):>8}")
    share = summary["training_share"]
    lines.append(f"faults injected {summary['injected']}, skipped {summary['skipped']}; job deaths relaunched "
                 f"{summary.get('job_deaths', 0)}; samples lost "
                 f"{summary.get('lost', '?')}, duplicated {summary.get('duplicated', '?')}; steps {summary['steps']}, "
                 f"rolled back {summary['rolled_back']}; trained {'-' if share is None else f'{share:.0%}'} of "
                 f"{summary['wall_s']:.0f} s; faults not recovered within the bound: {len(summary['slow'])}; "
                 f"false straggler drains: {len(summary.get('false_drains', ()))}; "
                 f"problems: {len(summary['problems'])}")
    if summary.get("not_back"):
        lines.append(f"at the end the job did not grow back to every host: {summary['not_back']}")
    return "\n".join(lines)
