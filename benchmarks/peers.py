"""Side by side with what users would pick instead: hvd-elastic, stock Horovod, torchrun, torchft.

``sudo .venv/bin/python benchmarks/peers.py [--stacks ...] [--isolated N] [--churn N]``

The same training job (``benchmarks/peers_train.py``: model, data, optimizer,
learning rate, global batch) under each stack (``testbed/peers.py``: set up
as its own docs recommend), on fresh netns hosts over real ssh, one training
process per host, under the same seeded fault schedule.  For each stack, in
turn: an uninterrupted run (the reference for goodput and accuracy), then the
run under faults.  Every figure comes from the ledger the training script
writes alike under all four (``benchmarks/peers_ledger.py``), never from a
stack's own bookkeeping.

Faults (``--kinds``): ``worker-kill`` (SIGKILL one training process),
``host-crash`` (every process of a host; it boots again after ``--down``
seconds), ``partition`` and ``freeze`` (healed / thawed after ``--down``),
``leave`` (the stack's graceful way; the host comes back after ``--down``)
and ``join`` (a new host).  A fault that cannot be injected on a stack at that
moment (no host left to take, the job not training yet) is skipped and
logged with the reason; the table says how many were injected per stack.

Output: a table on stdout, ``--json`` (one record per stack) and ``--png``
(per stack: world size and loss over wall time, faults marked).  Everything
started is torn down, also on failure or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers_ledger import Verdict, judge, kept_steps, read_rows, recoveries, tip  # noqa: E402
from testbed import peers  # noqa: E402

KINDS = ("worker-kill", "host-crash", "partition", "freeze", "leave", "join")
STEP_GAP_S = 2.0  # consecutive kept steps at most this far apart: the job was making progress between them


@dataclass
class Fault:
    at: float  # seconds after the job's first step
    kind: str
    host_index: int  # which of the stack's current hosts (modulo their number)
    churn: bool = False  # a churn join's host retires after --hold, so joins keep coming on a bounded bed


@dataclass
class Run:
    stack: str
    faults: list[dict] = field(default_factory=list)  # injected: time, kind, host; or skipped: reason
    start: float = 0.0
    end: float = 0.0
    exit_code: int | None = None
    deaths: list[dict] = field(default_factory=list)  # the job ended unfinished: time, exit code
    final: dict = field(default_factory=dict)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stacks", default=",".join(peers.STACKS), help="comma-separated, run in this order")
    parser.add_argument("--hosts", type=int, default=4, help="netns hosts at the start (default %(default)s)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="fault kinds (default: all)")
    parser.add_argument("--isolated", type=int, default=3, help="faults of each kind, one at a time (default 3)")
    parser.add_argument("--gap", type=float, default=25.0, help="seconds between isolated faults (default 25)")
    parser.add_argument("--churn", type=int, default=0, help="then this many overlapping faults (default 0)")
    parser.add_argument("--mtbf", type=float, default=15.0, help="churn: mean seconds between faults")
    parser.add_argument("--down", type=float, default=10.0, help="seconds a crashed/cut/frozen/left host stays out")
    parser.add_argument("--hold", type=float, default=30.0,
                        help="churn: seconds a joined host trains before it retires (a graceful leave); the next "
                             "join brings a retired host back before it adds one (default %(default)s)")
    parser.add_argument("--seed", type=int, default=None, help="the schedule's seed (default: random, printed)")
    parser.add_argument("--epochs", type=int, default=0, help="training epochs (default: enough for the schedule)")
    parser.add_argument("--step-time", type=float, default=0.1,
                        help="stand-in compute per step at full size (s); a rank's is proportional to its samples")
    parser.add_argument("--limit", type=float, default=900.0,
                        help="a run may last this long after its last fault before it is ended (s)")
    parser.add_argument("--relaunches", type=int, default=10,
                        help="times a job that ends unfinished is started again, as a scheduler would (default 10)")
    parser.add_argument("--smoke", action="store_true", help="no faults, one short epoch per stack: does it run")
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/peers.json"))
    parser.add_argument("--png", type=Path, default=None, help="the timelines picture (default: next to --json)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep every run's files here")
    args = parser.parse_args(argv)
    for flag, allowed in (("stacks", peers.STACKS), ("kinds", KINDS)):
        chosen = [v.strip() for v in getattr(args, flag).split(",") if v.strip()]
        if not chosen or set(chosen) - set(allowed):
            parser.error(f"--{flag} {getattr(args, flag)!r}: expected a comma-separated subset of {', '.join(allowed)}")
        setattr(args, flag, chosen)
    if args.hosts < 2:
        parser.error(f"--hosts {args.hosts}: expected at least 2 (one fault must leave a job to train)")
    if args.relaunches < 0:
        parser.error(f"--relaunches {args.relaunches}: expected 0 or more")
    return args


def schedule(args) -> list[Fault]:
    """Isolated faults (each kind ``--isolated`` times, shuffled, ``--gap`` apart), then the churn."""
    rng = random.Random(args.seed)
    kinds = [k for k in args.kinds for _ in range(args.isolated)]
    rng.shuffle(kinds)
    faults = [Fault(10.0 + i * args.gap, kind, rng.randrange(1 << 16)) for i, kind in enumerate(kinds)]
    at = 10.0 + len(kinds) * args.gap
    for _ in range(args.churn):
        at += rng.expovariate(1.0 / args.mtbf)
        faults.append(Fault(at, rng.choice(args.kinds), rng.randrange(1 << 16), churn=True))
    return faults


# -- one run of one stack --------------------------------------------------------------------------------------


class Injector:
    """Carries out one stack's faults and the heals that follow them."""

    def __init__(self, stack: peers.Stack, down: float, hold: float = 30.0):
        self.stack, self.down, self.hold = stack, down, hold
        self.out: set[str] = set()  # hosts currently crashed, cut, frozen or left
        self.retired: list[str] = []  # churn joins' hosts that left for good, until a join brings one back
        self.pending: list[tuple[float, str, str]] = []  # (when, action, host) heals due

    def inject(self, fault: Fault) -> dict:
        now = time.time()
        if fault.kind == "join":
            return {"time": now, "kind": fault.kind, "host": self._join(fault)}
        candidates = [h for h in self.stack.hosts() if h not in self.out and h not in self.retired]
        if len(candidates) < 2:
            return {"time": now, "kind": fault.kind, "skipped": "it would leave no host training"}
        host = candidates[fault.host_index % len(candidates)]
        if fault.kind == "worker-kill":
            pids = self.stack.trainer(host)
            if not pids:
                return {"time": now, "kind": fault.kind, "skipped": f"no training process on {host} yet"}
            for pid in pids:
                _kill(pid)
            return {"time": now, "kind": fault.kind, "host": host}
        act, heal = {"host-crash": (self.stack.bed.crash, "revive"), "partition": (self.stack.bed.partition, "heal"),
                     "freeze": (self.stack.bed.freeze, "thaw"), "leave": (self.stack.leave, "rejoin")}[fault.kind]
        act(host)
        self.out.add(host)
        self.pending.append((time.monotonic() + self.down, heal, host))
        return {"time": now, "kind": fault.kind, "host": host}

    def _join(self, fault: Fault) -> str:
        if self.retired:
            host = self.retired.pop(0)
            self.stack.rejoin(host)
        else:
            host = self.stack.join()
        if fault.churn:
            self.out.add(host)  # not a fault's target while it is the join under way, nor retired twice
            self.pending.append((time.monotonic() + self.hold, "retire", host))
        return host

    def heal_due(self, everything: bool = False) -> None:
        now = time.monotonic()
        for item in [p for p in self.pending if everything or p[0] <= now]:
            self.pending.remove(item)
            _, action, host = item
            if action == "revive":
                self.stack.revive(host)
            elif action == "heal":
                self.stack.bed.heal(host)
            elif action == "thaw":
                self.stack.bed.thaw(host)
            elif action == "retire":
                if not everything:  # at the run's end, a joined host simply stays
                    self.stack.leave(host)
                    self.retired.append(host)
            else:
                self.stack.rejoin(host)
            self.out.discard(host)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_stack(name: str, args, faults: list[Fault], workdir: Path, train_args: tuple[str, ...]) -> Run:
    """One run of stack ``name`` under ``faults`` (none: the uninterrupted reference)."""
    run = Run(name)
    with peers.make(name, workdir, args.hosts, train_args) as stack:
        injector = Injector(stack, args.down, args.hold)
        stack.launch()
        run.start = time.time()
        first = _wait_first_step(stack, timeout=300.0)
        pending = list(faults)
        deadline = first + (faults[-1].at if faults else 0.0) + args.limit
        relaunches = args.relaunches if faults else 0  # the reference run must not die
        while time.time() < deadline and (stack.running() or _relaunched(stack, run, injector, relaunches)):
            elapsed = time.time() - first
            while pending and pending[0].at <= elapsed:
                record = injector.inject(pending.pop(0))
                run.faults.append(record)
                print(f"  {name}: {record}", flush=True)
            injector.heal_due()
            time.sleep(0.2)
        injector.heal_due(everything=True)
        run.exit_code = stack.wait(60.0)  # None: still running at the deadline (the teardown ends it)
        run.end = time.time()
        final = stack.out / "final.json"
        run.final = json.loads(final.read_text()) if final.exists() else {}
        run.faults += [{"kind": f.kind, "skipped": "the job ended first"} for f in pending]
    return run


def _relaunched(stack: peers.Stack, run: Run, injector: Injector, most: int) -> bool:
    """The job ended unfinished: start it again, as the user's scheduler would, up to ``most`` times."""
    if (stack.out / "final.json").exists() or stack.launches > most:
        return False
    code = stack.wait(0.0)
    print(f"  {stack.name}: the job ended unfinished (exit {code}); relaunched", flush=True)
    run.deaths.append({"time": time.time(), "exit_code": code})
    stack.launch(out=injector.out)
    return True


def _wait_first_step(stack: peers.Stack, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = read_rows(str(stack.out))
        if rows:
            return rows[0]["t"]
        if not stack.running():
            raise RuntimeError(f"{stack.name}: the job ended before its first step (logs: {stack.workdir / 'logs'})")
        time.sleep(0.5)
    raise RuntimeError(f"{stack.name}: no step within {timeout:.0f} s (logs: {stack.workdir / 'logs'})")


# -- figures ---------------------------------------------------------------------------------------------------


def figures(run: Run, rows: list[dict], verdict: Verdict, reference: dict | None) -> dict:
    """One run's record for the table and the JSON, from its ledger ``rows`` and their ``verdict``."""
    kept = verdict.kept
    kept_times = sorted({row["t"] for row in rows if row["chain"] in kept})
    wall = max(run.end - run.start, 1e-9)
    progress = sum(b - a for a, b in zip(kept_times, kept_times[1:]) if b - a <= STEP_GAP_S)
    # A sample trained twice in an epoch (a lossy stack's replay) is useful once.
    useful = verdict.unique_samples
    record = {"stack": run.stack, "wall_s": round(wall, 1), "exit_code": run.exit_code,
              "faults_injected": sum("skipped" not in f for f in run.faults),
              "faults_skipped": sum("skipped" in f for f in run.faults), "relaunches": len(run.deaths),
              "deaths": run.deaths,
              "steps_kept": verdict.steps_kept, "steps_thrown": verdict.steps_thrown,
              "samples_lost": verdict.lost, "samples_duplicated": verdict.duplicated,
              "chain_broken": verdict.broken, "useful_samples_per_s": round(useful / wall, 2),
              "progress_share": round(progress / wall, 3), "test_accuracy": run.final.get("test_accuracy"),
              "test_loss": run.final.get("test_loss"),
              "recovery_s": recoveries(run.faults, kept_steps(rows, kept), run.end)}
    if reference is not None and reference.get("useful_samples_per_s"):
        record["goodput"] = round(record["useful_samples_per_s"] / reference["useful_samples_per_s"], 3)
        if record["test_accuracy"] is not None and reference.get("test_accuracy") is not None:
            record["accuracy_gap"] = round(reference["test_accuracy"] - record["test_accuracy"], 4)
    return record


def judged(run: Run, rows: list[dict], samples: int, epochs: int, reference: dict | None) -> tuple[dict, Verdict]:
    """One run's record and verdict from its ledger ``rows``: a finished run from its final chain over all
    ``epochs``, one cut off at --limit up to its newest step, over the epochs it completed."""
    final_chain, judged_epochs = (run.final.get("chain", -1), epochs) if run.final else tip(rows)
    verdict = judge(rows, final_chain, samples, judged_epochs)
    record = figures(run, rows, verdict, reference)
    record.update(finished=bool(run.final), epochs_done=judged_epochs)
    return record, verdict


def _p50(values: list) -> str:
    known = [v for v in values if v is not None]
    return f"{statistics.median(known):.1f}" if known else "-"


def table(records: list[dict]) -> str:
    head = (f"{'stack':<14} {'faults':>6} {'skip':>4} {'goodput':>7} {'progress':>8} {'lost':>5} {'dup':>5} "
            f"{'thrown':>6} {'acc gap':>7}  p50 by kind: pause / resize (s)")
    lines = [head]
    for r in records:
        rec = ", ".join(f"{k} {_p50(v['pause'])} / {_p50(v['resize'])}" for k, v in sorted(r["recovery_s"].items()))
        gap = r.get("accuracy_gap")
        name = r["stack"] + ("" if r.get("finished", True) else "*")
        lines.append(f"{name:<14} {r['faults_injected']:>6} {r['faults_skipped']:>4} "
                     f"{r.get('goodput', float('nan')):>7.3f} {r['progress_share']:>8.0%} {r['samples_lost']:>5} "
                     f"{r['samples_duplicated']:>5} {r['steps_thrown']:>6} "
                     f"{'-' if gap is None else f'{gap:+.3f}':>7}  {rec}")
    lines += [f"* {r['stack']}: cut off at --limit unfinished, judged up to its newest step ({r['epochs_done']} "
              f"epochs complete)" for r in records if not r.get("finished", True)]
    return "\n".join(lines)


def picture(runs: list[tuple[Run, list[dict], set[int]]], path: Path) -> None:
    """Per stack, one above the other: world size and loss of the kept steps over wall time, faults marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 2.6 * len(runs)), sharex=True, squeeze=False)
    for ax, (run, rows, kept) in zip(axes[:, 0], runs):
        steps = sorted({(r["t"], r["size"], r["loss"]) for r in rows if r["chain"] in kept and r["rank"] == 0})
        t = [row[0] - run.start for row in steps]
        ax.step(t, [row[1] for row in steps], where="post", color="tab:blue")
        ax.set_ylim(0, max((row[1] for row in steps), default=1) + 1)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(f"{run.stack}\nworld size")
        loss_ax = ax.twinx()
        loss_ax.plot(t, [row[2] for row in steps], color="tab:orange", linewidth=0.6)
        loss_ax.set_ylabel("loss")
        for fault in run.faults:
            if "skipped" not in fault:
                ax.axvline(fault["time"] - run.start, color="tab:red", alpha=0.4, linewidth=0.8)
                ax.text(fault["time"] - run.start, ax.get_ylim()[1], fault["kind"], rotation=90, fontsize=6,
                        va="top", color="tab:red")
    axes[-1, 0].set_xlabel("wall time (s); red: faults; blue: world size; orange: loss of the kept steps")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def versions() -> dict[str, str]:
    """What each stack ran on, for the record."""
    import importlib.metadata as md
    import subprocess

    found = {name: md.version(name) for name in ("torch", "horovod")}
    torchft = list(md.distributions(name="torchft", path=[str(peers.PEERS_SITE)]))
    found["torchft"] = torchft[0].version if torchft else "not installed (scripts/bootstrap.sh, step 5b)"
    consul = subprocess.run([str(peers.VENV_BIN / "consul"), "version"], capture_output=True, text=True)
    found["consul"] = consul.stdout.split("\n")[0] if consul.returncode == 0 else "not installed"
    return found


def _write_json(args, records: list[dict]) -> None:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"seed": args.seed, "hosts": args.hosts, "versions": versions(),
                                     "records": records}, indent=1))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.seed is None:
        args.seed = random.randrange(1 << 31)
    faults = [] if args.smoke else schedule(args)
    samples = 960 if args.smoke else 6144
    span = faults[-1].at + 60.0 if faults else 0.0
    # Long enough to outlast the schedule at the uninterrupted pace (global batch 48, --step-time per step).
    epochs = args.epochs or (1 if args.smoke else max(2, int(span / (samples / 48 * args.step_time)) + 1))
    train_args = ("--samples", str(samples), "--epochs", str(epochs), "--step-time", str(args.step_time),
                  "--full-world", str(args.hosts))
    print(f"peers: stacks {', '.join(args.stacks)}; {args.hosts} hosts; seed {args.seed}; {len(faults)} faults; "
          f"{epochs} epochs of {samples} samples", flush=True)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # run the teardowns
    root = args.workdir or Path(tempfile.mkdtemp(prefix="peers-"))
    records, timelines = [], []
    for name in args.stacks:
        reference = None
        for label, schedule_ in ((("reference", []),) if args.smoke else (("reference", []), ("faults", faults))):
            workdir = root / name / label
            run = run_stack(name, args, schedule_, workdir, train_args)
            rows = read_rows(str(workdir / "out"))
            record, verdict = judged(run, rows, samples, epochs, reference)
            record.update(run=label, seed=args.seed)
            print(f"  {name} {label}: {json.dumps(record)}", flush=True)
            if label == "reference":
                reference = record
            if label == "faults" or args.smoke:
                records.append(record)
                timelines.append((run, rows, verdict.kept))
                _write_json(args, records)  # after each stack: a run cut short keeps what it measured
    print(table(records))
    picture(timelines, args.png or args.json.with_suffix(".png"))
    problems = [r["stack"] for r in records
                if r["exit_code"] not in (0, None) or r["chain_broken"] or not r.get("finished", True)]
    if problems:
        print(f"peers: runs that did not end cleanly: {', '.join(problems)}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
