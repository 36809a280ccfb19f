"""A slow host under straggler policy ``drain`` and ``report``, against the same job without that host.

``sudo .venv/bin/python benchmarks/straggler.py [--quota 0.17] [--measure 60] [--json FILE] [--workdir DIR]``

On the network-namespace bed: 4 hosts over real ssh, HashiCorp Consul 1.8.7, a node
agent and a warm standby on every host, every setting at its default (the node
agents' straggler cool-down 5 min; the job's windows of 50 commits, 3 in a row,
threshold 1.5).  The job is the fault matrix's worker (``testbed/worker.py``, its
exactly-once evidence included) with real CPU work per sample (``--sample-cpu``),
one rank per host, a fixed batch per rank.  One host is made slow: its sshd and
its standby, and so every worker they start, go into a cgroup v1 cpu group whose
CFS quota is ``--quota`` of a core.  Four jobs on the same cluster, one after the
other:

1. ``without``: the slow host drained by hand, the job on the other 3 (the baseline);
2. ``report``: all 4, the slow one throttled, policy ``report``: the straggler's pace;
3. ``drain``: the same under policy ``drain``: the host is drained and the job goes
   on with 3; then the throttle is lifted, and once the node agent readmits the host
   (its cool-down) the job trains with 4 again;
4. ``full``: all 4, none throttled, policy ``drain`` (any drain there is a false one).

Throughput: samples committed per second, in ``--slices`` slices of
``--measure / --slices`` seconds each, from ``--settle`` seconds after the job
reached the size measured.  Prints a table, writes JSON (default
``benchmarks/results/straggler.json``) and a PNG beside it: each host's relative
speed and the world size over the ``drain`` job, its drain and readmission marked.
Every job ends with the fault matrix's verdict (every sample exactly once).  Exit
codes: 0 done (whatever the ratios: a timing run, not a test), 1 a job failed or
its verdict did not hold, 2 bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import RESULTS, Row, format_table, load_note, spread, write_json  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: testbed/ is not installed
from testbed.multihost import ElasticCluster, TrainingJob  # noqa: E402
from testbed.netns import unavailable_reason  # noqa: E402

from hvd_elastic.report.ledger import verdict  # noqa: E402
from hvd_elastic.training.events import EventLog  # noqa: E402

CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000  # the kernel's default CFS period
HOSTS, SLOW = 4, "hvdtb4"
# 0.16 s of CPU per rank per step, before the backward pass whose hooks start the gradient allreduce: the fast
# ranks must wait for the slow one inside it.  (Burnt after backward(), the wait fell in the worker's loss
# allreduce, every rank's work to the detector, and the throttled host measured 1.0x while the job's step time
# rose 2.5x; with 0.04 s it was 1.1-1.3x.)
BATCH, SAMPLE_CPU = 8, 0.02
WORKER = ("--samples", "2400", "--batch", str(BATCH), "--step-sleep", "0", "--sample-cpu", str(SAMPLE_CPU))
COOLDOWN_S = 300.0  # the node agent's default --straggler-cooldown, which this run keeps
WAIT = 600.0  # a hang guard for one phase, not a speed bound


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quota", type=float, default=0.17, help="the slow host's CPU, in cores (default 0.17)")
    parser.add_argument("--measure", type=float, default=60.0, help="seconds of training measured per size")
    parser.add_argument("--slices", type=int, default=6, help="slices of --measure (the spread's samples)")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds at a size before measuring it")
    parser.add_argument("--json", type=Path, default=RESULTS / "straggler.json")
    parser.add_argument("--png", type=Path, help="the picture (default: next to --json)")
    parser.add_argument("--workdir", type=Path, help="keep every job's files here (default: a temporary directory)")
    args = parser.parse_args(argv)
    if not 0 < args.quota < 1:
        parser.error(f"--quota {args.quota}: expected a share of one core, more than 0 and less than 1")
    if args.measure <= 0 or args.settle < 0 or args.slices < 1:
        parser.error(f"--measure {args.measure} --settle {args.settle} --slices {args.slices}: expected a positive "
                     "measure, a settle >= 0 and at least one slice")
    return args


@contextlib.contextmanager
def cpu_group(quota: float) -> Iterator[Path]:
    """A cgroup v1 cpu group of ``quota`` cores, emptied into the root group and removed afterwards."""
    group = CPU_CGROUP / f"hvd-elastic-straggler-{uuid.uuid4().hex[:12]}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(int(quota * PERIOD_US)))
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (CPU_CGROUP / "cgroup.procs").write_text(pid)
        group.rmdir()


def throttle(group: Path, cluster: ElasticCluster, host: str) -> None:
    """Put ``host``'s sshd and standby (and so every worker started later) into ``group``."""
    pids = [cluster.bed.hosts[host].sshd.pid, *(p.pid for p in cluster.bed.processes(host, "standby"))]
    for pid in pids:
        (group / "cgroup.procs").write_text(str(pid))


def lift(group: Path) -> None:
    (group / "cpu.cfs_quota_us").write_text("-1")


def throughput(rows: list[dict], size: int, since: float, args: argparse.Namespace) -> list[float]:
    """Samples per second in each slice of the measured span: from ``settle`` after the first step at ``size``
    after ``since``.  Raises ValueError when the job did not train that long at that size."""
    start = next(r["time"] for r in rows if r["time"] > since and r["size"] == size) + args.settle
    width = args.measure / args.slices
    slices = []
    for i in range(args.slices):
        lo, hi = start + i * width, start + (i + 1) * width
        steps = [r for r in rows if lo <= r["time"] < hi]
        if any(r["size"] != size for r in steps):
            raise ValueError(f"the world left size {size} during the measured span")
        slices.append(sum(r["size"] * BATCH for r in steps) / width)
    return slices


def measure_for(cluster: ElasticCluster, job: TrainingJob, size: int, since: float,
                args: argparse.Namespace) -> list[float]:
    """Wait until ``job`` has trained the measured span at ``size`` (after ``since``); its throughput slices."""
    first = cluster.wait_steps(job, size, since=since, timeout=WAIT)
    end = first["time"] + args.settle + args.measure
    job.wait_until(f"{args.measure:g} s measured at size {size}", lambda: time.time() > end + 1, WAIT)
    return throughput(cluster.progress(job), size, since, args)


def finish(cluster: ElasticCluster, job: TrainingJob) -> list[str]:
    """Stop ``job`` at its next epoch's end; the verdict's broken promises (none: every sample exactly once)."""
    cluster.stop(job, timeout=WAIT)
    return verdict(job.out).problems()


def run_jobs(cluster: ElasticCluster, group: Path, args: argparse.Namespace, work: Path) -> dict:
    """The four jobs; their throughputs, events, progress and verdicts, by name."""
    runs: dict[str, dict] = {}
    drain = {"HVD_ELASTIC_STRAGGLER": "drain"}

    def start(name: str, np: int, policy: dict) -> TrainingJob:
        return cluster.start_job(np, 1, HOSTS, *WORKER, name=name, out=work / name, env=policy)

    def done(name: str, job: TrainingJob, **measured) -> None:
        problems = finish(cluster, job)
        runs[name] = {**measured, "problems": problems, "events": EventLog.read(job.out / "events.jsonl"),
                      "progress": cluster.progress(job)}

    cluster.drain(SLOW)
    cluster.wait_discovered([f"{h}:1" for h in cluster.bed.hosts if h != SLOW])
    job = start("without", HOSTS - 1, drain)
    done("without", job, size3=measure_for(cluster, job, HOSTS - 1, 0.0, args))
    cluster.undrain(SLOW)
    cluster.wait_discovered([f"{h}:1" for h in cluster.bed.hosts])
    throttle(group, cluster, SLOW)

    job = start("report", HOSTS, {"HVD_ELASTIC_STRAGGLER": "report"})
    done("report", job, size4=measure_for(cluster, job, HOSTS, 0.0, args))

    job = start("drain", HOSTS, drain)
    asked = job.wait_until("the straggler's drain", lambda: next(
        (e for e in _events(job) if e["event"] == "straggler_drain" and e["status"] == "requested"), None), WAIT)
    size3 = measure_for(cluster, job, HOSTS - 1, asked["time"], args)
    lifted = time.time()
    lift(group)
    size4 = measure_for(cluster, job, HOSTS, lifted, args)
    rejoined = next(r["time"] for r in cluster.progress(job) if r["time"] > lifted and r["size"] == HOSTS)
    done("drain", job, size3=size3, size4=size4, asked=asked["time"], lifted=lifted, rejoined=rejoined)

    job = start("full", HOSTS, drain)
    done("full", job, size4=measure_for(cluster, job, HOSTS, 0.0, args))
    return runs


def _events(job: TrainingJob) -> list[dict]:
    path = job.out / "events.jsonl"
    return EventLog.read(path) if path.exists() else []


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # unwind: bed, group, cluster
    reason = unavailable_reason() or (None if os.access(CPU_CGROUP, os.W_OK) else
                                      f"{CPU_CGROUP} (cgroup v1's cpu controller) is not writable here")
    if reason:
        print(f"straggler: cannot run: {reason}", file=sys.stderr)
        return 1
    load_at_start = os.getloadavg()
    with contextlib.ExitStack() as stack:
        work = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hvd-elastic-straggler.")))
        group = stack.enter_context(cpu_group(args.quota))
        cluster = stack.enter_context(ElasticCluster(work / "cluster", hosts=HOSTS, standby="straggler",
                                                     preload="psutil,torch"))
        cluster.wait_discovered([f"{h}:1" for h in cluster.bed.hosts], timeout=120)
        try:
            runs = run_jobs(cluster, group, args, work)
        except (ValueError, RuntimeError, AssertionError, OSError) as exc:
            print(f"straggler: {exc}", file=sys.stderr)
            return 1
    return report(args, runs, load_at_start)


def report(args: argparse.Namespace, runs: dict, load_at_start) -> int:
    without = statistics.median(runs["without"]["size3"])
    full = statistics.median(runs["full"]["size4"])

    def row(label: str, samples: list[float], baseline: str, base: float) -> Row:
        return Row(label, spread(samples), unit="samples/s", baseline=baseline,
                   ratio=spread([s / base for s in samples]))

    rows = [Row("without the slow host (3 hosts)", spread(runs["without"]["size3"]), unit="samples/s"),
            row("report: 4 hosts, one slow", runs["report"]["size4"], "without", without),
            row("drain: after the drain (3 hosts)", runs["drain"]["size3"], "without", without),
            Row("full: 4 hosts, none slow", spread(runs["full"]["size4"]), unit="samples/s"),
            row("drain: after the readmission (4 hosts)", runs["drain"]["size4"], "full", full)]
    drains = {name: [e for e in run["events"] if e["event"] == "straggler_drain" and e["status"] == "requested"]
              for name, run in runs.items()}
    false = sum(len(d) for name, d in drains.items() if name in ("without", "full")) + sum(
        1 for d in drains["drain"] + drains["report"] if d["slow_host"] != SLOW)
    drain_ratio = statistics.median(runs["drain"]["size3"]) / without
    timing = runs["drain"]
    print(format_table(f"throughput, 4 netns hosts over ssh, {SLOW} held to {args.quota:g} of a core, default "
                       f"straggler settings ({load_note(load_at_start)})", rows))
    print(f"drain: asked {timing['asked'] - _first(runs['drain']):.1f} s after the job's first step; readmitted "
          f"(first step at 4) {timing['rejoined'] - timing['asked']:.1f} s after the drain; false drains {false}")
    problems = {name: run["problems"] for name, run in runs.items() if run["problems"]}
    for name, found in problems.items():
        print(f"straggler: the {name} job's verdict failed: {'; '.join(found)}", file=sys.stderr)
    png = args.png or args.json.with_suffix(".png")
    draw(runs, png, args)
    write_json(args.json, {"quota_cores": args.quota, "slow_host": SLOW, "hosts": HOSTS, "batch": BATCH,
                           "sample_cpu_s": SAMPLE_CPU, "cooldown_s": COOLDOWN_S, "measure_s": args.measure,
                           "settle_s": args.settle, "drain_throughput_ratio": drain_ratio,
                           "readmitted_throughput_ratio": statistics.median(runs["drain"]["size4"]) / full,
                           "report_throughput_ratio": statistics.median(runs["report"]["size4"]) / without,
                           "false_drains": false, "drains": drains, "verdicts": {n: r["problems"] for n, r in
                                                                              runs.items()},
                           "drain_asked_s": timing["asked"] - _first(runs["drain"]),
                           "readmitted_after_s": timing["rejoined"] - timing["asked"], "rows": rows})
    print(f"wrote {args.json} and {png}")
    return 1 if problems else 0


def _first(run: dict) -> float:
    return run["progress"][0]["time"]


def draw(runs: dict, path: Path, args: argparse.Namespace) -> None:
    """Each host's relative speed and the world size over the ``drain`` job; drain, lift and readmission marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = runs["drain"]
    t0 = _first(run)
    fig, (speed, size) = plt.subplots(2, 1, sharex=True, figsize=(11, 6.5), gridspec_kw={"height_ratios": [3, 2]})
    try:
        windows = [e for e in run["events"] if e["event"] == "pace"]
        hosts = sorted({h for e in windows for h in e["hosts"]})
        for host in hosts:
            # NaN where the host was not in the job: the line breaks instead of bridging its absence.
            points = [(e["time"] - t0, 1 / e["hosts"][host]["ratio"] if host in e["hosts"] and
                       e["hosts"][host]["ratio"] > 0 else float("nan")) for e in windows]
            speed.plot(*zip(*points), marker="o", markersize=3, linewidth=1.2 if host != SLOW else 2.2,
                       label=f"{host}{' (throttled, then lifted)' if host == SLOW else ''}")
        speed.axhline(1 / 1.5, color="grey", linestyle=":", label="slow in a window below this (threshold 1.5)")
        speed.set_ylabel("speed relative to the job's median rank")
        sizes = [(r["time"] - t0, r["size"]) for r in run["progress"]]
        size.step(*zip(*sizes), where="post", color="black", label="world size")
        size.set_ylim(0, HOSTS + 1)
        size.set_ylabel("world size")
        size.set_xlabel("seconds since the job's first step")
        for at, what, colour in ((run["asked"], "drain asked", "tab:brown"), (run["lifted"], "throttle lifted",
                                                                               "tab:blue"),
                                 (run["rejoined"], "readmitted: first step at 4", "tab:green")):
            for ax in (speed, size):
                ax.axvline(at - t0, color=colour, linestyle="--", label=what if ax is size else None)
        for ax in (speed, size):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, loc="lower right")
        fig.suptitle(f"straggler policy drain: {SLOW} held to {args.quota:g} of a core, drained, then readmitted "
                     f"after the node agent's {COOLDOWN_S / 60:g}-minute cool-down")
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
