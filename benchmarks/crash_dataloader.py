"""SIGKILL of a rank -> the survivor's first committed step at the new size, with DataLoader workers.

Issue 12: a killed rank's DataLoader workers kept its Gloo sockets (and its output)
open, so the survivor waited for them (about 5 s, torch's worker poll).  Here,
with ``hvd_elastic.training._internal.forksafe`` off ("before", ``HVD_ELASTIC_FORK_SAFETY=0``)
and on ("after"), for ``num_workers`` 0, 2 and 2 with ``persistent_workers=True``.

Set-up: elastic horovodrun, two ranks on the local pseudo-hosts ``localhost`` and
``127.0.0.1`` (plain host-file discovery), the worker of the fork-safety tests
(``tests/training_run/forksafe_worker.py``: TrainingState, ExactlyOnceSampler,
``@hvd_elastic.run`` with its event log).  ``--blacklist-cooldown-range 1 1`` lets
the killed rank's host rejoin, so one job per configuration runs every round:

1. wait until rank 1 (a process started for this round) and rank 0 trained
   ``--steps`` steps together;
2. SIGKILL rank 1's training process (its DataLoader workers are left alone);
3. measure from just before the kill to the first ``commit`` event at size 1 in
   rank 0's event log (both ``time.time()`` on this machine), and count the
   killed rank's children still alive at that moment.

A round whose kill ends the job (seen without the fix: the survivor's new
rendezvous waited for the dead rank and Gloo aborted it) is counted as failed and
the remaining rounds run in a new job, at most ``MAX_JOBS`` per configuration.

Rounds alternate after, before, after, ...: the switch is read by each training
process, and a round's figure depends on the killed process (its children hold
or release its connections), so the benchmark writes the switch for the process
that joins next (``$OUT/fork_safety``) and files each round under the setting
its killed process reported.  Target (after): <= 0.5 s and <= 2x num_workers=0.

    python benchmarks/crash_dataloader.py [--rounds 5] [--steps 10] [--json PATH] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: testbed/ is not installed
from testbed import REPO, Job, JobError, JsonLines, child_env, horovodrun_elastic, host_file_discovery  # noqa: E402
from testbed.procs import is_alive  # noqa: E402

WORKER = REPO / "tests" / "training_run" / "forksafe_worker.py"
#: label -> the worker's loader configuration
CONFIGS = {"0": "w0", "2": "w2", "2 + persistent_workers": "w2p"}
MODES = ("after", "before")  # round i runs MODES[i % 2]
TARGET_SECONDS = 0.5
TARGET_RATIO = 2.0
MAX_JOBS = 3  # per configuration: a round that ends its job is followed by a new job


@dataclasses.dataclass
class Victim:
    pid: int
    fork_safety: bool
    joined_at: float  # when it entered training (its record's mtime)


def find_victim(out: Path, events: JsonLines, killed: set[int], steps: int) -> Victim | None:
    """A live rank 1 of a world of 2, not killed yet, that trained ``steps`` steps since it joined."""
    for path in (out / "procs").glob("*.json"):
        pid = int(path.stem)
        if pid in killed or not psutil.pid_exists(pid):
            continue
        try:
            rec = json.loads(path.read_text())
            joined_at = path.stat().st_mtime
        except (OSError, ValueError):
            continue
        if rec["rank"] == 1 and rec["size"] == 2:
            together = [e for e in events.rows() if e["event"] == "commit" and e["size"] == 2
                        and e["time"] > joined_at]
            if len(together) >= steps:
                return Victim(pid, rec["fork_safety"], joined_at)
    return None


def first_after(events: JsonLines, event: str, since: float, size: int | None = None) -> dict | None:
    """The first ``event`` (at ``size``, if given) logged after ``since``."""
    return next((e for e in events.rows() if e["event"] == event and e["time"] > since
                 and (size is None or e["size"] == size)), None)


def run_config(label: str, loader: str, rounds: int, steps: int, workdir: Path) -> list[dict]:
    """``2 * rounds`` kills of one configuration; one record per round.

    A round that ends the job (Horovod can abort the survivor, see :func:`run_job`)
    is recorded as failed and the next rounds run in a new job, at most
    ``MAX_JOBS`` jobs per configuration.
    """
    records: list[dict] = []
    for attempt in range(MAX_JOBS):
        if len(records) >= 2 * rounds:
            break
        records += run_job(label, loader, range(len(records), 2 * rounds), steps, workdir / f"{loader}.{attempt}")
    return records


def run_job(label: str, loader: str, round_numbers: range, steps: int, out: Path) -> list[dict]:
    """One job running ``round_numbers``; stops early, with a failed record, if a round ends it."""
    out.mkdir(parents=True)
    # The first two processes run the first round's setting; each kill sets the next joiner's.
    (out / "fork_safety").write_text("1" if MODES[round_numbers[0] % 2] == "after" else "0")
    discovery = host_file_discovery(out / "hosts", "localhost:1\n127.0.0.1:1\n")
    cmd = horovodrun_elastic(discovery, 2, 1, 2, "--blacklist-cooldown-range", "1", "1", sys.executable, WORKER)
    env = child_env(OUT=str(out), LOADERS=loader, EPOCHS="1000000", SAMPLES="4096", LEDGER="0", STEP_SLEEP="0.02")
    events = JsonLines(out / "events.jsonl")
    killed: set[int] = set()
    records = []
    with Job(cmd, env=env, logdir=out, name="horovodrun") as job:
        job.start()
        for i in round_numbers:
            try:
                victim = job.wait_until(f"{label}, round {i}: rank 1 training in a world of 2",
                                        lambda: find_victim(out, events, killed, steps), timeout=240)
            except JobError as exc:  # the round never started: the next job runs it
                print(f"  {label:>24} round {i:2d} job lost before the kill: {str(exc).splitlines()[0]}", flush=True)
                break
            (out / "fork_safety").write_text("1" if MODES[(i + 1) % 2] == "after" else "0")
            mode = "after" if victim.fork_safety else "before"
            children = psutil.Process(victim.pid).children(recursive=True)
            killed.add(victim.pid)
            killed_at = time.time()
            os.kill(victim.pid, signal.SIGKILL)
            try:
                first = job.wait_until(f"{label}, round {i}: the survivor's first commit in a world of 1",
                                       lambda: first_after(events, "commit", killed_at, size=1), timeout=60)
            except JobError as exc:
                records.append({"round": i, "mode": mode, "seconds": None, "failed": str(exc).splitlines()[0],
                                "log_tail": job.log_tail(1500)})
                print(f"  {label:>24} round {i:2d} {mode:6s} FAILED: {records[-1]['failed']}", flush=True)
                break
            alive = sum(1 for c in children if is_alive(c))
            # Where the time went: the failed collective (rank 0 restores), the new world (sync).
            restored, synced = first_after(events, "restore", killed_at), first_after(events, "sync", killed_at, 1)
            records.append({"round": i, "mode": mode, "seconds": first["time"] - killed_at,
                            "restore_after_s": restored["time"] - killed_at if restored else None,
                            "sync_after_s": synced["time"] - killed_at if synced else None,
                            "children_of_killed": len(children), "children_alive_at_first_commit": alive})
            r = records[-1]
            print(f"  {label:>24} round {i:2d} {mode:6s} {r['seconds']:7.3f} s (restore {_s(r['restore_after_s'])}, "
                  f"sync {_s(r['sync_after_s'])}; killed rank's children alive then: {alive}/{len(children)})",
                  flush=True)
    return records


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3f} s"


def summarize(results: dict[str, list[dict]]) -> dict:
    """Median, min, max and n per configuration and mode; ratios with their baselines."""
    summary: dict[str, dict] = {}
    for label, records in results.items():
        summary[label] = {}
        for mode in MODES:
            xs = [r["seconds"] for r in records if r["mode"] == mode and r["seconds"] is not None]
            failed = sum(1 for r in records if r["mode"] == mode and r["seconds"] is None)
            summary[label][mode] = ({"n": len(xs), "median": statistics.median(xs), "min": min(xs), "max": max(xs)}
                                    if xs else {"n": 0})
            summary[label][mode]["failed"] = failed
    baseline = summary["0"]["after"]
    for label, cell in summary.items():
        after, before = cell["after"], cell["before"]
        if after["n"] and before["n"]:
            cell["after_vs_before"] = after["median"] / before["median"]
        if after["n"] and baseline["n"]:
            cell["after_vs_workers_0"] = after["median"] / baseline["median"]
            cell["target_met"] = after["median"] <= TARGET_SECONDS and (
                label == "0" or cell["after_vs_workers_0"] <= TARGET_RATIO)
    return summary


def markdown(summary: dict) -> str:
    def cell(c: dict) -> str:
        text = f"{c['median']:.3f} s ({c['min']:.3f}-{c['max']:.3f}), n={c['n']}" if c["n"] else "no rounds"
        return text + (f", {c['failed']} round(s) ended the job" if c["failed"] else "")

    base = summary["0"]["after"]
    base_text = f"{base['median']:.3f} s, n={base['n']}" if base["n"] else "none"
    lines = [
        "| DataLoader num_workers | before: fix off (min-max) | after: fix on (min-max) | after / before "
        f"| after / num_workers=0 after (baseline {base_text}) "
        f"| target <= {TARGET_SECONDS} s and <= {TARGET_RATIO:g}x |",
        "|---|---|---|---|---|---|",
    ]
    for label, c in summary.items():
        vs_before = (f"{c['after_vs_before']:.3f}x (n={c['after']['n']} vs {c['before']['n']})"
                     if "after_vs_before" in c else "")
        vs_base = (f"{c['after_vs_workers_0']:.2f}x (n={c['after']['n']} vs {base['n']})"
                   if "after_vs_workers_0" in c else "")
        met = {True: "met", False: "missed"}.get(c.get("target_met"), "")
        lines.append(f"| {label} | {cell(c['before'])} | {cell(c['after'])} | {vs_before} | {vs_base} | {met} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds per configuration and mode (default 5)")
    parser.add_argument("--steps", type=int, default=10, help="steps both ranks train before each kill (default 10)")
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "crash_dataloader.json"))
    parser.add_argument("--workdir", help="keep the jobs' files here (default: a temporary folder, removed)")
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be positive")

    load_start = os.getloadavg()
    started = time.monotonic()
    results = {}
    with tempfile.TemporaryDirectory(prefix="crash_dataloader.") as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for label, loader in CONFIGS.items():
            results[label] = run_config(label, loader, args.rounds, args.steps, workdir)
    summary = summarize(results)
    table = markdown(summary)
    note = (f"SIGKILL of rank 1 -> rank 0's first committed step at size 1; {os.cpu_count()} CPUs, "
            f"load average {load_start[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end, "
            f"{time.monotonic() - started:.0f} s in all")
    print(f"\n{note}\n\n{table}")
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": "crash_dataloader", "command": " ".join(sys.argv), "note": note,
                                "rounds_per_mode": args.rounds, "steps_before_kill": args.steps,
                                "summary": summary, "rounds": results, "load_average_start": load_start,
                                "load_average_end": os.getloadavg(), "cpus": os.cpu_count()}, indent=2) + "\n")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
