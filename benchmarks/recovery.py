"""Seconds from a membership event to the first committed step at the new world size, on real hosts.

Four network-namespace hosts reached over real ssh (``testbed``),
one slot each; the job trains ``testbed.worker`` on three of them
and the fourth is the one that joins.  Two modes, interleaved round by round
(the first mode alternates), on the same hosts, model and horovodrun flags:

* hvd-elastic -- ``TrainingState`` + ``ExactlyOnceSampler`` + ``@hvd_elastic.run``,
  hosts from ``discovery/consul_hosts`` fed by node agents in the hosts, on
  HashiCorp Consul (a client agent in every host);
* hvd-elastic/dev -- the same on the project's dev agent (``--consul consul,dev``,
  the default, measures both in the same run; the bed holds one Consul at a
  time, so each round builds the cluster once per Consul, in alternating order);
* hvd-elastic/standby -- with ``--standby``: the same on HashiCorp Consul, every
  host running a warm ``hvd-elastic standby`` that its node agent waits for and
  that forks the workers (``hvd-elastic exec``), in a cluster of its own;
* horovod     -- stock Horovod elastic (``TorchState`` + ``ElasticSampler`` +
  ``hvd.elastic.run``) with a plain host-file discovery script, the way
  Horovod's own tests drive membership.

Events, each followed by its undo (which also ends the round's world at 3):

=========== ============================================ ==============================
event       hvd-elastic                                  horovod (host file)
=========== ============================================ ==============================
join        the 4th host's node agent starts             its line is added
drain       ``hvd-elastic drain`` on a host              its line is removed
ttl         a host's node agent is SIGKILLed             (no equivalent: not measured)
crash       one worker SIGKILLed                         the same
host-crash  every process of a host SIGKILLed            the same
partition   the host's link goes down                    the same
freeze      every process of a host SIGSTOPped           the same
=========== ============================================ ==============================

``--gloo-timeout`` (default 60 s, what jobs with long collectives need) and
``--ssh-keepalive`` (default off: OpenSSH's client defaults, as most users run
horovodrun) set what a partition or a freeze waits for without hvd-elastic's
lost-host cut (:mod:`hvd_elastic.health.lost`).  A sample that has not
reached the new size after ``2 x gloo timeout + 30`` s is recorded at that cap
and counted as not recovered.

Reported per event and mode: median (p10-p90) seconds over ``--rounds``, the
paired ratio hvd-elastic / horovod, the steps rolled back, for a join also the
time from the joiner's registration in Consul (its node agent's start-up is the
host booting, which a host-file edit skips), the survivors' pause (last committed
step at the old size -> first at the new one), and for hvd-elastic
a per-phase breakdown read from the event log (detection, interrupt,
re-initialisation = rendezvous with any new worker, sync, first step) and the
joining worker's own start-up.  Writes ``benchmarks/results/recovery.json``.

    sudo .venv/bin/python benchmarks/recovery.py [--rounds 3] [--events join,drain,...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from report import RESULTS, Row, format_table, load_note, paired_ratio, spread, write_json

from hvd_elastic.training.events import EventLog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: testbed/ is not installed
from testbed import JobError, wait_until  # noqa: E402
from testbed.consul import consul_request  # noqa: E402
from testbed.multihost import ElasticCluster  # noqa: E402
from testbed.netns import unavailable_reason  # noqa: E402

EVENTS = ("join", "drain", "ttl", "crash", "host-crash", "partition", "freeze")
MODES = ("hvd-elastic", "hvd-elastic/dev", "hvd-elastic/standby", "horovod")
# The clusters a round builds, and the modes each runs: the baseline needs no Consul, standbys a cluster of their own.
CONSULS = {"consul": ("hvd-elastic", "horovod"), "dev": ("hvd-elastic/dev",)}
CLUSTERS = {**CONSULS, "standby": ("hvd-elastic/standby",)}
STANDBY = "bench"
JOINER = "hvdtb4"
BASE_HOSTS = ("hvdtb1", "hvdtb2", "hvdtb3")
COOLDOWN = ("--blacklist-cooldown-range", "2", "3")
GLOO_TIMEOUT = 60  # set by --gloo-timeout
WORKER_ARGS: tuple[str, ...] = ()  # set by --worker-import
WAIT = 3 * GLOO_TIMEOUT + 60  # every wait is bounded


def set_gloo_timeout(seconds: int) -> None:
    global GLOO_TIMEOUT, WAIT
    GLOO_TIMEOUT, WAIT = seconds, 3 * seconds + 60


def recovery_cap() -> float:
    """How long one sample may take before it counts as not recovered."""
    return 2 * GLOO_TIMEOUT + 30


class Round:
    """One job of one mode on the cluster, through which each event passes once."""

    def __init__(self, cluster: ElasticCluster, mode: str, out: Path):
        self.cluster, self.mode = cluster, mode
        self.consul = mode != "horovod"
        self.hosts = list(BASE_HOSTS)
        if mode == "horovod":
            self.job = cluster.start_job(3, 2, 4, "--api", "horovod", *WORKER_ARGS, out=out,
                                         host_file=self._lines(), horovodrun_args=COOLDOWN)
        else:
            self.job = cluster.start_job(3, 2, 4, *WORKER_ARGS, out=out, horovodrun_args=COOLDOWN)
        cluster.wait_steps(self.job, size=3, steps=5, timeout=WAIT)

    def _lines(self, hosts=None) -> str:
        return "".join(f"{h}:1\n" for h in (hosts or self.hosts))

    def _set_hosts(self, hosts: list[str]) -> None:
        (self.job.out / "hosts").write_text(self._lines(hosts))

    def victim(self) -> str:
        size = max(w["size"] for w in self.cluster.workers(self.job))
        return next(w["host"] for w in self.cluster.workers(self.job) if w["size"] == size and w["rank"] == 1)

    def measure(self, event: str) -> dict:
        """Inject ``event``, time it, undo it; the figures of this one sample."""
        c, consul = self.cluster, self.consul
        time.sleep(1.0)  # a steady world before the event
        victim = JOINER if event == "join" else self.victim()
        old, new = (3, 4) if event == "join" else (3, 2)
        t0 = time.time()
        if event == "join":
            c.start_agent(JOINER) if consul else self._set_hosts([*self.hosts, JOINER])
        elif event == "drain":
            c.drain(victim) if consul else self._set_hosts([h for h in self.hosts if h != victim])
        elif event == "ttl":
            c.stop_agent(victim)
        elif event == "crash":
            c.bed.crash(victim, match=str(self.job.out))
        elif event == "host-crash":
            c.bed.crash(victim)
        elif event == "partition":
            c.bed.partition(victim)
        elif event == "freeze":
            c.bed.freeze(victim)
        # When the joiner became visible: a host-file line at once, a node agent once it has registered
        # (its own start-up is the host booting, not the job recovering).
        registered = self._registered(JOINER) if event == "join" and consul else t0
        try:
            first = c.wait_steps(self.job, size=new, since=t0, timeout=recovery_cap())
        except JobError:
            if not self.job.running():
                raise
            first = None  # not recovered within the cap: recorded at the cap
        if first is None:
            sample = {"seconds": recovery_cap(), "recovered": False, "rolled_back": 0, "host": victim,
                      "from_registration": recovery_cap()}
        else:
            sample = {"seconds": first["time"] - t0, "recovered": True, "rolled_back": self._rolled_back(t0, first),
                      "host": victim, "from_registration": first["time"] - registered,
                      "pause": first["time"] - self._last_step(old, first["time"])}
            if consul:
                sample["phases"] = self._phases(t0, first, joined=event == "join")
        self._undo(event, victim, old)
        return sample

    def _registered(self, host: str) -> float:
        """Poll the launcher's Consul agent until ``host``'s instance passes; the time it was first seen."""
        def passing():
            code, entries = consul_request(self.cluster.consul_addr(), "GET", "/v1/health/service/horovod?passing")
            return code == 200 and any(e["Node"]["Node"] == host for e in entries)
        wait_until(f"{host} registered and passing", passing, timeout=WAIT, interval=0.02)
        return time.time()

    def _undo(self, event: str, victim: str, size: int) -> None:
        c, consul = self.cluster, self.consul
        t = time.time()
        if event == "join":
            if consul:
                c.agents[JOINER].stop()  # SIGTERM: the agent deregisters, a graceful leave
            else:
                self._set_hosts(self.hosts)
        elif event == "drain":
            c.undrain(victim) if consul else self._set_hosts(self.hosts)
        elif event in ("ttl", "host-crash"):
            c.start_agent(victim)
        elif event == "partition":
            c.bed.heal(victim)
        elif event == "freeze":
            c.bed.thaw(victim)
        c.wait_steps(self.job, size=size, steps=3, since=t, timeout=WAIT)

    def _last_step(self, size: int, before: float) -> float:
        """When the last step at world ``size`` committed before wall time ``before``."""
        return max(r["time"] for r in self.cluster.progress(self.job) if r["size"] == size and r["time"] < before)

    def _rolled_back(self, t0: float, first: dict) -> int:
        """Steps committed before the event that the new world trained again."""
        before = [r["step"] for r in self.cluster.progress(self.job)
                  if r["time"] < first["time"] and r["time"] >= t0 - 60]
        return max(0, max(before, default=0) - (first["step"] - 1))

    def _phases(self, t0: float, first: dict, joined: bool) -> dict:
        events = EventLog.read(self.job.out / "events.jsonl")
        reset = next(e for e in events if e["event"] == "reset" and e.get("interrupted_at", 0) > t0)
        noticed = reset.get("notified_at") or reset["interrupted_at"]
        sync = next((e for e in events
                     if e["event"] == "sync" and reset["interrupted_at"] < e["time"] <= reset["time"]),
                    None)
        reinit_end = sync["time"] - sync["seconds"] if sync else reset["time"]
        phases = {"detection": noticed - t0, "interrupt": reset["interrupted_at"] - noticed,
                  "re-initialisation": reinit_end - reset["interrupted_at"],
                  "sync": sync["seconds"] if sync else 0.0, "first step": first["time"] - reset["time"]}
        if joined:
            worker = max(self.cluster.workers(self.job), key=lambda w: w["process_start"])
            phases["joiner: start-up"] = worker["imported"] - worker["process_start"]
            phases["joiner: hvd.init"] = worker["initialised"] - worker["imported"]
            phases["joiner: start after event"] = worker["process_start"] - t0
        return phases

    def close(self) -> None:
        self.cluster.stop(self.job, timeout=WAIT)


def run_round(cluster: ElasticCluster, mode: str, out: Path, events: list[str], samples: dict, r: int) -> None:
    """One job of ``mode`` through every event, its samples added to ``samples``."""
    round_ = Round(cluster, mode, out)
    try:
        for event in events:
            if event == "ttl" and mode == "horovod":
                continue
            sample = round_.measure(event)
            samples[event][mode].append(sample)
            print(f"round {r + 1} {mode:<15} {event:<10} {sample['seconds']:6.2f} s "
                  f"rolled back {sample['rolled_back']}", flush=True)
    finally:
        round_.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="samples per event and mode (default %(default)s)")
    parser.add_argument("--events", default=",".join(EVENTS), help="comma-separated subset of " + ",".join(EVENTS))
    parser.add_argument("--consul", default="consul,dev",
                        help="comma-separated Consuls for hvd-elastic: consul (HashiCorp's), dev (default %(default)s)")
    parser.add_argument("--gloo-timeout", type=int, default=GLOO_TIMEOUT,
                        help="HOROVOD_GLOO_TIMEOUT_SECONDS of every job (default %(default)s)")
    parser.add_argument("--ssh-keepalive", action="store_true",
                        help="give horovodrun's ssh keep-alives (ServerAliveInterval 2); default: OpenSSH's defaults")
    parser.add_argument("--standby", action="store_true",
                        help="also measure hvd-elastic with a warm standby on every host (HashiCorp Consul)")
    parser.add_argument("--worker-import", default="", metavar="MOD[,MOD...]",
                        help="modules every worker imports before hvd.init() (a heavier start-up, say "
                             "torch._inductor.compile_fx); the standbys preload them too")
    parser.add_argument("--json", type=Path, default=RESULTS / "recovery.json")
    args = parser.parse_args(argv)
    global WORKER_ARGS
    WORKER_ARGS = ("--import", args.worker_import) if args.worker_import else ()
    if args.gloo_timeout < 1:
        parser.error(f"--gloo-timeout {args.gloo_timeout}: expected a number of seconds >= 1")
    set_gloo_timeout(args.gloo_timeout)
    events = args.events.split(",")
    consuls = args.consul.split(",")
    bad = [e for e in events if e not in EVENTS]
    if bad or args.rounds < 1:
        parser.error(f"unknown event(s) {bad} (expected some of {', '.join(EVENTS)})" if bad
                     else "--rounds must be >= 1")
    if not consuls or any(c not in CONSULS for c in consuls):
        parser.error(f"--consul {args.consul!r}: expected a comma-separated subset of {', '.join(CONSULS)}")
    reason = unavailable_reason()
    if reason:
        print(f"recovery: cannot run: {reason}", file=sys.stderr)
        return 1

    clusters = [*consuls, *(["standby"] if args.standby else [])]
    load_at_start = os.getloadavg()
    samples: dict[str, dict[str, list[dict]]] = {e: {m: [] for m in MODES} for e in events}
    with tempfile.TemporaryDirectory(prefix="hvd-elastic-recovery.") as tmp:
        for r in range(args.rounds):
            for kind in (clusters if r % 2 == 0 else clusters[::-1]):
                preload = ",".join(filter(None, ["psutil", args.worker_import]))
                standby = {"standby": STANDBY, "preload": preload} if kind == "standby" else {}
                with ElasticCluster(Path(tmp) / f"{kind}-{r}", hosts=4, ttl=3.0, gloo_timeout=GLOO_TIMEOUT,
                                    consul="dev" if kind == "dev" else "consul", ssh_keepalive=args.ssh_keepalive,
                                    **standby) as cluster:
                    cluster.wait_discovered([f"{h}:1" for h in (*BASE_HOSTS, JOINER)], timeout=WAIT)
                    cluster.agents[JOINER].stop()  # the joiner is not there at start (its standby, if any, is)
                    modes = CLUSTERS[kind]
                    for mode in (modes if r % 2 == 0 else modes[::-1]):
                        run_round(cluster, mode, Path(tmp) / f"{mode.replace('/', '-')}-{r}", events, samples, r)

    rows, report = [], {"rounds": args.rounds, "gloo_timeout_s": GLOO_TIMEOUT, "hosts": 4, "clusters": clusters,
                        "worker_import": args.worker_import,
                        "ssh_keepalive": args.ssh_keepalive, "recovery_cap_s": recovery_cap(), "events": {}}
    for event in events:
        base = [s["seconds"] for s in samples[event]["horovod"]]
        ours_mode = "hvd-elastic" if samples[event]["hvd-elastic"] else "hvd-elastic/dev"
        ours = [s["seconds"] for s in samples[event][ours_mode]]
        entry = {**samples[event],
                 "rolled_back_median": statistics.median(s["rolled_back"] for s in samples[event][ours_mode])}
        phases = [s["phases"] for s in samples[event][ours_mode] if "phases" in s]
        entry["phases_median_s"] = {k: statistics.median(p[k] for p in phases) for k in phases[0]} if phases else {}
        entry["not_recovered"] = {m: sum(not s.get("recovered", True) for s in samples[event][m]) for m in MODES}
        report["events"][event] = entry
        warm = [s["seconds"] for s in samples[event]["hvd-elastic/standby"]]
        if warm and ours:
            rows.append(Row(f"{event}: hvd-elastic, standby", spread(warm), baseline=f"{ours_mode}, {event}",
                            ratio=paired_ratio(warm, ours)))
        dev = [s["seconds"] for s in samples[event]["hvd-elastic/dev"]]
        if dev and ours_mode == "hvd-elastic":
            rows.append(Row(f"{event}: hvd-elastic, dev agent", spread(dev), baseline=f"hvd-elastic, Consul, {event}",
                            ratio=paired_ratio(dev, ours)))
        if base:
            rows.append(Row(f"{event}: horovod + host file", spread(base)))
            rows.append(Row(f"{event}: {ours_mode}", spread(ours), baseline=f"horovod + host file, {event}",
                            ratio=paired_ratio(ours, base)))
            if event == "join":
                registered = [s["from_registration"] for s in samples[event][ours_mode]]
                rows.append(Row("join from registration: hvd-elastic", spread(registered),
                                baseline="horovod + host file, join", ratio=paired_ratio(registered, base)))
                base_pause = [s["pause"] for s in samples[event]["horovod"] if "pause" in s]
                if base_pause:
                    rows.append(Row("join, survivors' pause: horovod + host file", spread(base_pause)))
                for mode in ("hvd-elastic", "hvd-elastic/standby"):
                    pause = [s["pause"] for s in samples[event][mode] if "pause" in s]
                    if pause and base_pause:
                        rows.append(Row(f"join, survivors' pause: {mode}", spread(pause),
                                        baseline="horovod + host file, pause", ratio=paired_ratio(pause, base_pause)))
        else:
            rows.append(Row(f"{event}: {ours_mode} (no baseline)", spread(ours)))
    report["rows"] = rows
    print()
    print(format_table(f"event -> first committed step at the new size, 4 netns hosts over ssh, gloo timeout "
                       f"{GLOO_TIMEOUT} s, ssh {'with' if args.ssh_keepalive else 'without'} keep-alives"
                       + (f", workers import {args.worker_import}" if args.worker_import else "")
                       + f" ({load_note(load_at_start)})", rows))
    for event in events:
        for mode, count in report["events"][event]["not_recovered"].items():
            if count:
                print(f"{event}: {mode}: {count} sample(s) not at the new size within {recovery_cap():.0f} s "
                      "(recorded at that cap)")
    print("\nhvd-elastic phases (median s): " + "; ".join(
        f"{event}: " + ", ".join(f"{k} {v:.2f}" for k, v in report["events"][event]["phases_median_s"].items())
        for event in events))
    print("steps rolled back (median): " + ", ".join(
        f"{e} {report['events'][e]['rolled_back_median']:g}" for e in events))
    write_json(args.json, report)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
