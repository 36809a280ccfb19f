"""Re-judge a finished ``benchmarks/peers.py`` run from what it left: its ``--workdir`` and its stdout log.

``.venv/bin/python benchmarks/peers_rejudge.py LOG [LOG ...] WORKDIR --json OUT.json [--png OUT.png]``

Several logs: a comparison run a few stacks at a time (the whole of it takes
longer than a session), each run with the same ``--workdir`` and schedule,
judged and drawn as one.

For runs made before b363653, whose harness scored a run cut off at ``--limit``
unfinished as having kept nothing (goodput 0).  Each stack's faulted run is
judged again from its ledger alone, the finished ones from their ``final.json``
chain and the unfinished ones up to their newest step (``peers_ledger.tip``),
exactly as the harness does now.  The log gives what the ledger does not: the
references' figures and the faults' times.  Two things are approximated and
said in the JSON: a run's end is its first step plus its recorded wall time,
and the picture's time axis starts at each job's first step (the faults are
scheduled from it, so every stack's faults line up).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import peers  # noqa: E402
from peers_ledger import read_rows  # noqa: E402


def logged(log: str, stack: str, what: str) -> dict:
    match = re.search(rf"^  {re.escape(stack)} {what}: (.*)$", log, re.MULTILINE)
    if match is None:
        raise SystemExit(f"peers_rejudge: no '{stack} {what}' line in the log")
    return json.loads(match.group(1))


def rejudge(log: str, workdir: Path, stack: str, samples: int, epochs: int) -> tuple[dict, peers.Run, list, set]:
    reference, record = logged(log, stack, "reference"), logged(log, stack, "faults")
    faults = [ast.literal_eval(m) for m in re.findall(rf"^  {re.escape(stack)}: (\{{'time'.*\}})$", log, re.MULTILINE)]
    rows = read_rows(str(workdir / stack / "faults" / "out"))
    final_file = workdir / stack / "faults" / "out" / "final.json"
    final = json.loads(final_file.read_text()) if final_file.exists() else {}
    run = peers.Run(stack, faults=faults, start=min(r["t"] for r in rows), exit_code=record["exit_code"],
                    deaths=record["deaths"], final=final)
    run.end = run.start + record["wall_s"]
    fresh, verdict = peers.judged(run, rows, samples, epochs, reference)
    fresh.update(run="faults", seed=record["seed"],
                 rejudged="from the ledger by benchmarks/peers_rejudge.py; end = first step + wall time")
    return fresh, run, rows, verdict.kept


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", type=Path, nargs="+", metavar="LOG",
                        help="the run's stdout; several: runs of some stacks each, same workdir and schedule")
    parser.add_argument("workdir", type=Path, help="the run's --workdir")
    parser.add_argument("--json", type=Path, required=True, help="the run's JSON: its records are replaced")
    parser.add_argument("--png", type=Path, default=None, help="the picture (default: next to --json)")
    args = parser.parse_args(argv)
    for flag, path, what in (*(("LOG", log, "stdout") for log in args.logs), ("--json", args.json, "JSON")):
        if not path.is_file():
            parser.error(f"{flag} {str(path)!r}: no such file (expected the run's {what})")
    if not args.workdir.is_dir():
        parser.error(f"WORKDIR {str(args.workdir)!r}: no such directory (expected the run's --workdir)")
    data = json.loads(args.json.read_text())
    judged = []
    for path in args.logs:
        log = path.read_text()
        head = re.search(r"^peers: stacks (.*); \d+ hosts; seed \d+; \d+ faults; (\d+) epochs of (\d+) samples$", log,
                         re.MULTILINE)
        if head is None:
            parser.error(f"{path}: not a peers.py log (no 'peers: stacks ...' line)")
        stacks, epochs, samples = head.group(1).split(", "), int(head.group(2)), int(head.group(3))
        done = [s for s in stacks if (args.workdir / s / "faults" / "out").exists() and f"  {s} faults: " in log]
        judged += [rejudge(log, args.workdir, stack, samples, epochs) for stack in done]
    data["records"] = [record for record, *_ in judged]
    args.json.write_text(json.dumps(data, indent=1))
    peers.picture([(run, rows, kept) for _, run, rows, kept in judged], args.png or args.json.with_suffix(".png"))
    print(peers.table(data["records"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
