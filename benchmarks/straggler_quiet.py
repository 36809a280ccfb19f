"""The straggler detector on a job with no slow host: how many windows it judged, and how many false reports.

``.venv/bin/python benchmarks/straggler_quiet.py [--minutes M] [--noise] [--json FILE]``

One elastic job on local pseudo-hosts (``localhost`` with 2 slots, ``127.0.0.1``
with 1: three ranks, the straggler tests' worker, ``tests/training_run/pace_worker.py``)
under the default straggler settings (policy ``report``, windows of 50 commits,
3 in a row, threshold 1.5), for ``--minutes``.  No rank is throttled, so every
``straggler`` event is a false report.  ``--noise`` adds load that hits every
rank alike: one process that burns a core in bursts of random length (seeded),
the kind of noise a shared 2-core machine makes.  Prints the windows judged,
the hosts found slow in a window, the false reports and the spread of each
host's ratio to the job's median; writes JSON (default
``benchmarks/results/straggler_quiet.json``).  Exit codes: 0 done (whatever
it found: a timing run, not a test), 1 the job failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import RESULTS, Row, format_table, load_note, spread, write_json  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: testbed/ is not installed
from testbed import Job, child_env, horovodrun_elastic, host_file_discovery  # noqa: E402

from hvd_elastic.training.events import EventLog  # noqa: E402

WORKER = Path(__file__).resolve().parents[1] / "tests" / "training_run" / "pace_worker.py"
HOSTS = "localhost:2\n127.0.0.1:1\n"
STEPS_PER_MINUTE = 600  # more than this box trains: the job is ended at --minutes, not by its step count
NOISE = ("import random, sys, time\n"
         "rng, end = random.Random(int(sys.argv[1])), time.monotonic() + float(sys.argv[2])\n"
         "while time.monotonic() < end:\n"
         "    burst = time.monotonic() + rng.uniform(0.5, 3.0)\n"
         "    while time.monotonic() < burst: pass\n"
         "    time.sleep(rng.uniform(0.5, 3.0))\n")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="how long the job trains (default 20)")
    parser.add_argument("--noise", action="store_true", help="add bursts of CPU load that hit every rank alike")
    parser.add_argument("--seed", type=int, default=7, help="the noise's seed (default 7)")
    parser.add_argument("--json", type=Path, default=RESULTS / "straggler_quiet.json")
    args = parser.parse_args(argv)
    if not 0 < args.minutes <= 600:
        parser.error(f"--minutes {args.minutes}: expected more than 0 and at most 600")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    seconds = args.minutes * 60
    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="straggler-quiet.") as tmp:
        workdir = Path(tmp)
        events = workdir / "events.jsonl"
        noise = (subprocess.Popen([sys.executable, "-c", NOISE, str(args.seed), str(seconds)]) if args.noise
                 else None)
        env = child_env(EVENT_LOG=str(events), STEPS=str(int(args.minutes * STEPS_PER_MINUTE)))
        discover = host_file_discovery(workdir / "hosts", HOSTS)
        try:
            with Job([*horovodrun_elastic(discover, 3, 3, 3), sys.executable, str(WORKER)], logdir=workdir,
                     name="launch", env=env) as job:
                job.start()
                deadline = time.monotonic() + seconds
                while job.running() and time.monotonic() < deadline:
                    time.sleep(1.0)
                # The log goes with the temporary directory: its tail is kept for the failure message.
                failure = (f"the job exited {job.returncode}: {job.log_tail(600).strip()}"
                           if not job.running() and job.returncode != 0 else None)
        finally:
            if noise is not None:
                noise.kill()
                noise.wait()
        records = EventLog.read(events)
    if failure:
        print(f"straggler_quiet: {failure}", file=sys.stderr)
        return 1
    return report(args, records, load_at_start)


def report(args: argparse.Namespace, records: list[dict], load_at_start) -> int:
    windows = [r for r in records if r["event"] == "pace"]
    judged = [w for w in windows if w["judged"]]
    slow = [(host, w["time"]) for w in judged for host, h in w["hosts"].items() if h["slow"]]
    false = [r for r in records if r["event"] == "straggler"]
    ratios = {}
    for w in judged:
        for host, h in w["hosts"].items():
            ratios.setdefault(host, []).append(h["ratio"])
    rows = [Row(f"{host}: ratio to the job's median", spread(values), unit="x") for host, values in ratios.items()]
    title = (f"straggler detector, no slow host, {args.minutes:g} min{', with noise' if args.noise else ''}: "
             f"{len(judged)} windows judged, {len(slow)} host-windows slow, {len(false)} false reports "
             f"({load_note(load_at_start)})")
    print(format_table(title, rows))
    write_json(args.json, {"minutes": args.minutes, "noise": args.noise, "seed": args.seed,
                           "windows": len(windows), "windows_judged": len(judged), "slow_host_windows": len(slow),
                           "false_reports": len(false), "reports": false, "rows": rows})
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
