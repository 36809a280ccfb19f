"""benchmarks/before_after.py: one benchmark, two commits' trees, interleaved rounds, rows paired by label."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import before_after  # noqa: E402


def test_rows_pair_by_label_round_by_round_and_a_label_one_run_misses_is_left_out():
    before = [{"commit": 2.0, "sync": 4.0}, {"commit": 4.0, "sync": 4.0, "only here": 1.0}]
    after = [{"commit": 1.0, "sync": 4.0, "only here": 1.0}, {"commit": 4.0, "sync": 2.0}]
    rows = {row.label: row for row in before_after.compare(before, after)}
    assert sorted(rows) == ["commit (before 3)", "sync (before 4)"]
    assert rows["commit (before 3)"].ratio["median"] == pytest.approx(0.75)  # 0.5 and 1.0, round by round
    assert rows["sync (before 4)"].value["median"] == pytest.approx(3.0)


def test_an_unknown_commit_is_one_line_and_exit_2():
    done = subprocess.run([sys.executable, str(BENCHMARKS / "before_after.py"), "--before", "no-such-rev",
                           "metrics_overhead.py"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"before_after: 'no-such-rev' is not a commit of {BENCHMARKS.parent}"]


def a_repository(tmp_path: Path) -> Path:
    """A git repository of this tree's package, test bed and benchmarks, with one commit: CI's checkout may not
    be a repository of its own (an export), and the script's trees are made with git."""
    repo = tmp_path / "repo"
    skip = shutil.ignore_patterns("__pycache__", "results", "*.pyc")
    for part in ("hvd_elastic", "testbed", "benchmarks"):
        shutil.copytree(BENCHMARKS.parent / part, repo / part, ignore=skip)
    git = ["git", "-C", str(repo), "-c", "user.name=test", "-c", "user.email=test@example.invalid"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the tree under test"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    return repo


@pytest.mark.slow
def test_a_real_benchmark_runs_from_both_trees_and_is_compared(tmp_path):
    repo, out = a_repository(tmp_path), tmp_path / "ba.json"
    done = subprocess.run([sys.executable, str(repo / "benchmarks" / "before_after.py"), "--before", "HEAD",
                           "--rounds", "2", "--json", str(out), "metrics_overhead.py", "--", "--steps", "20",
                           "--rounds", "2"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert len(report["runs"]["before"]) == len(report["runs"]["after"]) == 2
    assert report["rows"] and all(row["ratio"] is not None for row in report["rows"])
    assert "round 2/2, after" in done.stdout and "round 2/2, before" in done.stdout
