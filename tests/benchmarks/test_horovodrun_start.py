"""benchmarks/horovodrun_start.py, one round: every kind starts its workers and the JSON holds its samples."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "horovodrun_start.py"


@pytest.mark.slow
def test_one_round_reports_every_kind(tmp_path):
    out = tmp_path / "start.json"
    run = subprocess.run([sys.executable, str(BENCHMARK), "--rounds", "1", "--json", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(out.read_text())
    assert set(report["samples"]) == {"stock", "hvd-elastic", "hvd-elastic, first run"}
    for measure in ("samples", "cpu_s"):
        assert set(report[measure]) == set(report["samples"])
        assert all(len(values) == 1 and values[0] > 0 for values in report[measure].values())
    assert [row["baseline"] for row in report["rows"]] == [None, "stock", "stock"] * 2
