"""The demo's scenario: one elastic training job put through every kind of membership event, then judged.

Everything runs on this machine, the way ``consul agent -dev`` runs Consul:

1. Consul for three nodes: ``localhost`` and ``127.0.0.1`` (horovodrun treats
   them as two hosts, both local) and a spare that joins later (this machine's
   host name, or ``--spare-host``: any name of a local address, which
   horovodrun also runs locally).  HashiCorp Consul (a server agent and a
   client agent per node, on loopback) when bootstrap fetched its binary, else
   the embedded Consul-compatible dev agent; ``--consul`` chooses, and the demo
   says which it runs on;
2. a node agent per started node registers the training service with one slot
   and keeps a TTL check passing;
3. ``horovodrun`` runs :mod:`hvd_elastic.demo.train` (a CNN on scikit-learn's
   bundled digits) elastically, with the discovery script as its host source;
   one plain process trains the same model uninterrupted next to it (the reference);
4. the demo works through the ``--events`` schedule (:mod:`.schedule`); after
   each event it waits until the job has trained ``--phase-steps`` steps at the
   world size the event leads to, then lets training finish at full speed.

It ends with ``hvd-elastic report``'s timeline (recovery time and rolled-back
steps per event), the exactly-once verdict of the ranks' ledgers, the final
test accuracy next to the reference's, and where the files are.  Exit 0 only
when training finished and every one of those checks holds; 1 otherwise; 2 for
a schedule or flag that cannot work (refused before anything starts).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from hvd_elastic.hostnames import is_valid_host
from hvd_elastic.errors import HvdElasticError
from hvd_elastic.horovodrun.rules import COOLDOWN
from hvd_elastic.local.env import CONSUL_HOSTS, HVD_ELASTIC, child_env
from hvd_elastic.local.job import MARK_ENV, Job, JobError, horovodrun_elastic, start_node_agent, wait_until
from hvd_elastic.local.realconsul import CONSUL, consul_cluster, unavailable_reason
from hvd_elastic.nodeagent.standby import standby_state

from . import schedule
from .digits import read_result, steps_per_epoch
from .live import Console

log = logging.getLogger("hvd_elastic.demo")

START_HOSTS = ("localhost", "127.0.0.1")
SERVICE = "horovod"
MIN_NP = 1
REJOIN_S = 2.0 * COOLDOWN[0]  # a killed worker's host is blacklisted at least this long (hvd_elastic.horovodrun)
TRAIN_MODULE = "hvd_elastic.demo.train"
# What the training module imports (torch, horovod and torch._dynamo are the standby's own).
STANDBY_PRELOAD = "numpy,psutil,sklearn.datasets,hvd_elastic,hvd_elastic.report.evidence,hvd_elastic.demo.digits"


class DemoFailed(HvdElasticError, RuntimeError):
    pass


def spare_host(name: str | None) -> str | None:
    """The 'add' event's node: ``name``, else this machine's host name; None when no usable name exists."""
    candidate = name or socket.gethostname()
    local = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET}
    try:
        address = socket.gethostbyname(candidate)
    except OSError:
        address = None
    usable = is_valid_host(candidate) and candidate not in START_HOSTS and address in local
    if name is not None and not usable:
        raise ValueError(f"--spare-host {name!r}: expected a host name (not {' or '.join(START_HOSTS)}) that "
                         f"resolves to an address of this machine ({', '.join(sorted(local))}), so horovodrun runs "
                         f"it locally; it resolves to {address}")
    return candidate if usable else None


def check_budget(events: list[schedule.Event], args: argparse.Namespace) -> None:
    """Refuse a schedule that needs more steps than training has (it would finish mid-schedule).

    Each phase trains --phase-steps steps, and training goes on at the old size while an event
    takes effect (a drain is seen within a discovery round or two, a TTL only once it expired):
    at most that time over --step-delay steps.  A restart redoes up to --checkpoint-every steps.
    """
    total = args.epochs * steps_per_epoch()
    takes_effect = {"drain": 2.0, "undrain": 2.0, "add": 2.0, "ttl": args.ttl + 2.0, "kill-worker": REJOIN_S + 2.0,
                    "restart": 0.0}
    pace = max(args.step_delay, 0.01)
    needed = (len(events) + 2) * args.phase_steps + sum(
        int(takes_effect[e.action] / pace) - (args.checkpoint_every if e.action == "restart" else 0) for e in events)
    if needed > total:
        raise ValueError(f"--events needs about {needed} steps ({len(events)} events, "
                         f"--phase-steps {args.phase_steps}, "
                         f"--step-delay {args.step_delay}), but --epochs {args.epochs} trains {total}; raise --epochs "
                         f"or --step-delay, or lower --phase-steps")


# ------------------------------------------------------------------ the run


class _Run:
    """The processes of one demo and the actions it takes on them."""

    def __init__(self, args, workdir: Path, cluster, console: Console, cleanup: contextlib.ExitStack):
        self.args, self.workdir, self.cluster, self.console, self.cleanup = args, workdir, cluster, console, cleanup
        self.logs = workdir / "logs"
        self.env = {node: child_env(scrub=False, CONSUL_HTTP_ADDR=cluster.addr(node)) for node in cluster.nodes}
        self.agents: dict[str, Job] = {}
        self.standby: Job | None = None
        # One standby serves every simulated node: they are all this machine.
        self.standby_name = f"demo-{os.getpid()}"
        self.job: Job | None = None
        self.launches = 0
        self.actions = workdir / "actions.jsonl"

    def start_standby(self) -> None:
        """``hvd-elastic standby`` with the training script's imports; returns once it answers."""
        self.standby = self.cleanup.enter_context(Job(
            [HVD_ELASTIC, "standby", "--name", self.standby_name, "--preload", STANDBY_PRELOAD],
            env=child_env(scrub=False), logdir=self.logs, name="standby"))
        self.standby.start()

        def ready() -> bool:
            return standby_state(self.standby_name) is None

        self.standby.wait_until("the standby to answer", ready, self.args.timeout, 0.2)

    def start_agent(self, node: str) -> None:
        gate = ["--standby", self.standby_name] if self.standby else []
        agent = start_node_agent("--service", SERVICE, "--slots", "1", "--ttl", str(self.args.ttl),
                                 "--checkpoint-path", str(self.workdir), "--min-free-disk", "64M",
                                 "--min-free-memory", "64M", *gate, env=self.env[node], logdir=self.logs,
                                 name=f"node-agent.{node}")
        self.agents[node] = self.cleanup.enter_context(agent)
        self.cleanup.callback(_stop_gracefully, agent)  # SIGTERM first, so it deregisters; the Job kills for sure

    def launch(self, np: int) -> None:
        """Start horovodrun (a new launch: a restart resumes from the checkpoint in the run directory)."""
        self.launches += 1
        launcher = [HVD_ELASTIC, "exec", "--standby", self.standby_name, "--"] if self.standby else []
        cmd = [*horovodrun_elastic(CONSUL_HOSTS, np, MIN_NP, len(self.cluster.nodes)),
               *launcher, sys.executable, "-m", TRAIN_MODULE, "--out", self.workdir, "--epochs", self.args.epochs,
               "--step-delay", self.args.step_delay, "--checkpoint-every", self.args.checkpoint_every]
        self.job = self.cleanup.enter_context(
            Job(cmd, env=dict(self.env[START_HOSTS[0]], HOROVOD_GLOO_TIMEOUT_SECONDS="30"), logdir=self.logs,
                name=f"horovodrun.launch{self.launches}"))
        self.job.start()

    @property
    def launched(self) -> Job:
        """The horovodrun job :meth:`launch` started last."""
        if self.job is None:
            raise DemoFailed("no job launched yet")
        return self.job

    def record(self, action: str, host: str | None) -> float:
        """Append the action to actions.jsonl (the report pairs it with the change it causes); its time."""
        now = time.time()
        with open(self.actions, "a") as f:
            f.write(json.dumps({"time": now, "action": action, "host": host}) + "\n")
        return now

    def act(self, event: schedule.Event) -> float:
        """Carry out ``event``; returns when it was done (Unix time)."""
        host = event.host
        at = self.record(event.action, host)
        if event.action == "restart":
            self.launched.kill()
            self._wait_forked_workers_gone()
            self.launch(event.size_after)
        elif host is None:  # schedule.plan gives every other action a host
            raise DemoFailed(f"the schedule's {event.action} event has no host")
        elif event.action in ("drain", "undrain"):
            out = subprocess.run([str(HVD_ELASTIC), event.action, "--service", SERVICE,
                                  *(["--reason", "demo: node reclaimed"] if event.action == "drain" else [])],
                                 env=self.env[host], capture_output=True, text=True, timeout=60)
            if out.returncode != 0:
                raise DemoFailed(f"hvd-elastic {event.action} on {host} failed: {out.stderr.strip()}")
        elif event.action == "add":
            self.start_agent(host)
        elif event.action == "ttl":
            self.agents[host].kill()  # no deregistration: the TTL check has to expire
        elif event.action == "kill-worker":
            pid = self.worker_on(host)
            psutil.Process(pid).kill()
        return at

    def worker_on(self, host: str) -> int:
        """The pid of the live training process on ``host`` (from the pids/ files the workers write)."""
        candidates = []
        for path in (self.workdir / "pids").glob("*.json"):
            with contextlib.suppress(OSError, ValueError):
                info = json.loads(path.read_text())
                if info["host"] == host and self._is_our_worker(info["pid"]):
                    candidates.append(info["pid"])
        if len(candidates) != 1:
            raise DemoFailed(f"expected one training process on {host}, found {len(candidates)}")
        return candidates[0]

    def _is_our_worker(self, pid: int) -> bool:
        try:
            proc = psutil.Process(pid)
            if self.standby is not None and proc.ppid() == self.standby.pid:
                return True  # forked: its command line is the standby's
            return MARK_ENV in proc.environ() and TRAIN_MODULE in proc.cmdline() and str(self.workdir) in proc.cmdline()
        except psutil.Error:
            return False

    def _wait_forked_workers_gone(self) -> None:
        """After the job's processes were killed: its forked workers end too (their launchers' sockets closed)."""
        if self.standby is None:
            return
        standby = psutil.Process(self.standby.pid)
        self.standby.wait_until("the killed job's forked workers to end", lambda: not standby.children(),
                                self.args.timeout, 0.1)

    def wait_size(self, size: int, since: float, steps: int, what: str) -> float:
        """Wait until ``steps`` steps were committed at world ``size`` after ``since``; the first one's time."""
        job = self.launched
        progress = self.console.progress

        def reached():
            self.console.refresh()
            rows = [r for r in progress.rows() if r["time"] > since and r["size"] == size]
            return rows[0]["time"] if len(rows) >= steps else None

        try:
            return job.wait_until(f"{steps} steps at world size {size}", reached, self.args.timeout, 0.2)
        except JobError as exc:
            if job.returncode == 0:
                raise DemoFailed(f"{what}: training finished before the event took effect; raise --epochs or "
                                 f"--step-delay") from None
            raise DemoFailed(f"{what}: {str(exc).splitlines()[0]}; see {job.logs[-1]}") from None

    def wait_finished(self) -> None:
        """Wait for the job to end; DemoFailed unless it exited 0."""
        job = self.launched

        def finished() -> bool:
            self.console.refresh()
            return not job.running()

        try:
            job.wait_until("the job to finish", finished, self.args.timeout, 0.2)
        except JobError as exc:
            raise DemoFailed(f"{str(exc).splitlines()[0]}; see {job.logs[-1]}") from None
        if job.returncode != 0:
            raise DemoFailed(f"the job exited with {job.returncode}; see {job.logs[-1]}")


def _stop_gracefully(agent: Job) -> None:
    with contextlib.suppress(JobError):
        agent.stop(timeout=10)


def consul_kind(choice: str) -> str:
    """The Consul ``--consul`` names: "consul" or "dev"; ValueError when HashiCorp's was asked for and cannot run."""
    reason = unavailable_reason()
    if choice == "consul" and reason:
        raise ValueError(f"--consul consul: {reason}")
    return "dev" if choice == "dev" or (choice == "auto" and reason) else "consul"


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the demo will do, checked before anything starts."""

    events: list[schedule.Event]
    spares: list[str]  # the nodes the 'add' events bring in
    consul: str  # "consul" (HashiCorp's agents) or "dev"


def plan(args: argparse.Namespace) -> Plan:
    """The flags' plan; raises ScheduleError or ValueError, naming the flag, for one that cannot work."""
    spare = spare_host(args.spare_host)
    spares = [spare] if spare else []
    events = schedule.plan(schedule.parse(args.events), list(START_HOSTS), spares, MIN_NP)
    check_budget(events, args)
    return Plan(events, spares, consul_kind(args.consul))


def run_demo(args, workdir: Path, plan: Plan, console: Console) -> None:
    """Start everything, work through the plan's events, wait for the end; everything started is ended on every path."""
    events, spares, consul = plan.events, plan.spares, plan.consul
    # The ExitStack ends everything the demo started, last started first: jobs, then node agents
    # (gracefully, then for sure), then the reference run; Consul last.
    with consul_cluster(consul, [*START_HOSTS, *spares]) as cluster, contextlib.ExitStack() as cleanup:
        console.say(f"Consul: HashiCorp Consul ({CONSUL}), a server agent and a client agent per node"
                    if consul == "consul"
                    else "Consul: the embedded dev agent (hvd-elastic consul-dev), one node per host")
        demo = _Run(args, workdir, cluster, console, cleanup)
        reference = cleanup.enter_context(Job(
            [sys.executable, "-m", TRAIN_MODULE, "--out", workdir / "reference", "--epochs", args.epochs,
             "--checkpoint-every", args.checkpoint_every], env=child_env(scrub=False), logdir=demo.logs,
            name="reference"))
        reference.start()
        console.say("reference: the same model trained uninterrupted by one process, in the background")
        if args.standby:
            demo.start_standby()
            console.say(f"standby {demo.standby_name} ready: workers start forked from it, torch already imported")
        for node in START_HOSTS:
            demo.start_agent(node)
        _wait_discovered(demo.env[START_HOSTS[0]], [f"{h}:1" for h in START_HOSTS], timeout=60)
        console.say(f"node agents up on {' and '.join(START_HOSTS)}; spare node: {', '.join(spares) or 'none'}")
        t0 = time.time()
        demo.launch(len(START_HOSTS))
        demo.wait_size(len(START_HOSTS), t0, args.phase_steps, "start")
        console.say(f"training at world size {len(START_HOSTS)}", event="start")
        size = len(START_HOSTS)
        for event in events:
            at = demo.act(event)
            label = f"{event.action} {event.host or 'the whole job'}"
            console.say(f"{label}: waiting for world size {event.size_after}", event=label)
            # A killed worker's host is back no sooner than its cooldown: count only steps after that.
            settle = REJOIN_S if event.action == "kill-worker" else 0.0
            first = demo.wait_size(event.size_after, at + settle, args.phase_steps, label)
            console.say(f"{label}: world size {size} -> {event.size_after}, first step after {first - at:.1f} s",
                        event=label)
            size = event.size_after
        (workdir / "fast").touch()  # every event done: the rest of training runs at full speed
        console.say("schedule done; training the rest at full speed")
        demo.wait_finished()
        try:
            reference.finish(args.timeout)
        except JobError as exc:
            raise DemoFailed(f"the reference run failed: {str(exc).splitlines()[0]}; "
                             f"see {reference.logs[-1]}") from None
        console.say("training finished")


def _wait_discovered(env: dict[str, str], expected: list[str], timeout: float) -> None:
    def listed() -> bool:
        out = subprocess.run([str(HVD_ELASTIC), "discover"], env=env, capture_output=True, text=True, timeout=60)
        return out.returncode == 0 and sorted(out.stdout.split()) == sorted(expected)

    try:
        wait_until(f"discovery to print {expected}", listed, timeout, interval=0.3)
    except JobError:
        raise DemoFailed(f"discovery never printed {expected}") from None


# ------------------------------------------------------------------ the verdict


def summary(args, workdir: Path, console: Console) -> bool:
    """Print the report, the checks and the files; True when every check holds."""
    from hvd_elastic.report.summary import draw_png, make_report

    report = make_report(workdir)
    png = draw_png(report)
    elastic, reference = read_result(workdir), read_result(workdir / "reference")
    print("\nsummary\n" + report.text)
    checks = {"training finished": report.timeline.finished and elastic is not None,
              "exactly-once": report.exactly_once_ok is True}
    if elastic and reference:
        gap = abs(elastic["accuracy"] - reference["accuracy"])
        checks["accuracy"] = gap <= args.accuracy_tolerance
        print(f"accuracy on {elastic['test_samples']} held-out digits: elastic {100 * elastic['accuracy']:.1f}% vs "
              f"uninterrupted {100 * reference['accuracy']:.1f}% (gap {100 * gap:.1f} points, allowed "
              f"{100 * args.accuracy_tolerance:.1f}): {'OK' if checks['accuracy'] else 'FAILED'}")
    else:
        checks["accuracy"] = False
        print("accuracy: FAILED: a run left no result.json")
    print(f"files: {workdir}\n  events.jsonl (event log), progress.jsonl (per step), actions.jsonl (demo events), "
          f"ledger/ (samples per rank and step), ckpt/ (checkpoints), logs/, reference/\n  picture: {png}\n"
          f"  again: hvd-elastic report {workdir}")
    failed = [name for name, ok in checks.items() if not ok]
    if failed:
        print(f"checks FAILED: {', '.join(failed)}")
    return not failed
