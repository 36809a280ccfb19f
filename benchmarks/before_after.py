"""One benchmark run against two commits of this repository, interleaved: did a change move its figures?

``.venv/bin/python benchmarks/before_after.py --before COMMIT [--after REV] [--rounds N] -- SCRIPT [ARG ...]``

Each round runs ``benchmarks/SCRIPT ARG ... --json FILE`` once from each
commit's tree (a detached ``git worktree`` for each, in a temporary
directory), the order alternating from round to round, with ``PYTHONPATH``
pointing at that tree so its ``hvd_elastic``, ``testbed`` and benchmark run,
not the checkout's; the processes the benchmark starts inherit it (horovodrun
forwards it to its workers).  Both commits share this checkout's virtual
environment.  The script must write :mod:`report`'s JSON (``rows`` of
``label`` and ``value``); rows are matched by label, and each row's after /
before ratio is taken round by round (:func:`report.paired_ratio`), so load
that hits one round hits both sides alike.

Prints one table (each row: before's median, after's median, the paired
ratio) and writes ``--json`` (default ``benchmarks/results/before_after_SCRIPT.json``).
Exit codes: 0 done, 1 a run failed (its output's tail is printed), 2 bad input
(an unknown commit, a script that does not exist in both trees).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import RESULTS, Row, format_table, load_note, paired_ratio, spread, write_json  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PROG = "before_after"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the commit before the change")
    parser.add_argument("--after", default="HEAD", help="the commit after it (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each commit, interleaved (default 2)")
    parser.add_argument("--json", type=Path, help="the results (default benchmarks/results/before_after_SCRIPT.json)")
    parser.add_argument("script", help="a benchmark in benchmarks/ that writes report's JSON to --json")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments (after --)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: expected 1 or more")
    args.args = args.args[1:] if args.args[:1] == ["--"] else args.args
    return args


def resolve(rev: str) -> str:
    """The full commit of ``rev``; ValueError naming it when git does not know it."""
    done = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                          capture_output=True, text=True)
    if done.returncode:
        raise ValueError(f"{rev!r} is not a commit of {REPO}")
    return done.stdout.strip()


@contextlib.contextmanager
def worktree(commit: str, path: Path):
    """A detached work tree of ``commit`` at ``path``, removed afterwards."""
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(path), commit], check=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], check=False)


def run_once(tree: Path, script: str, args: list[str], out: Path) -> dict[str, float]:
    """One run of ``script`` from ``tree``: its rows' medians by label.  Raises RuntimeError when it fails."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, str(tree / "benchmarks" / script), *args, "--json", str(out)]
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    if done.returncode or not out.exists():
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise RuntimeError(f"{script} from {tree} exited {done.returncode}:\n{tail}")
    return {row["label"]: row["value"]["median"] for row in json.loads(out.read_text()).get("rows", [])}


def compare(before: list[dict[str, float]], after: list[dict[str, float]]) -> list[Row]:
    """One row per label every run of both commits reported: after's spread, as a paired ratio to before's."""
    labels = [label for label in after[0] if all(label in run for run in before + after)]
    rows = []
    for label in labels:
        b, a = [run[label] for run in before], [run[label] for run in after]
        rows.append(Row(f"{label} (before {statistics.median(b):.3g})", spread(a), baseline="before",
                        ratio=paired_ratio(a, b) if all(b) else None))
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        commits = {"before": resolve(args.before), "after": resolve(args.after)}
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    out = args.json or RESULTS / f"before_after_{Path(args.script).stem}.json"
    load_at_start = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="before-after.") as tmp, \
            worktree(commits["before"], Path(tmp) / "before") as before_tree, \
            worktree(commits["after"], Path(tmp) / "after") as after_tree:
        trees = {"before": before_tree, "after": after_tree}
        missing = [side for side, tree in trees.items() if not (tree / "benchmarks" / args.script).is_file()]
        if missing:
            print(f"{PROG}: benchmarks/{args.script} does not exist at {' and '.join(missing)} "
                  f"({', '.join(commits[m][:12] for m in missing)})", file=sys.stderr)
            return 2
        for r in range(args.rounds):
            for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
                print(f"{PROG}: round {r + 1}/{args.rounds}, {side} ({commits[side][:12]})", flush=True)
                try:
                    runs[side].append(run_once(trees[side], args.script, args.args, Path(tmp) / f"{side}-{r}.json"))
                except RuntimeError as exc:
                    print(f"{PROG}: {exc}", file=sys.stderr)
                    return 1
    rows = compare(runs["before"], runs["after"])
    title = (f"{args.script} {' '.join(args.args)}: {commits['after'][:7]} against {commits['before'][:7]}, "
             f"{args.rounds} interleaved round(s) ({load_note(load_at_start)})")
    print()
    print(format_table(title, rows))
    write_json(out, {"script": args.script, "args": args.args, "commits": commits, "rounds": args.rounds,
                     "runs": runs, "rows": rows})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
