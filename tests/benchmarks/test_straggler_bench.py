"""``benchmarks/straggler.py`` without the bed: its throughput slices, its report and its picture from a made-up
set of four jobs, so the long run on the bed cannot end in a bug of its own bookkeeping."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import straggler as bench  # noqa: E402


def rows(start: float, end: float, size: int, step_s: float) -> list[dict]:
    count = int(round((end - start) / step_s))
    return [{"time": start + i * step_s, "size": size} for i in range(count)]


def test_throughput_is_samples_per_second_in_each_slice_after_the_settle():
    args = bench.parse_args(["--measure", "60", "--slices", "6", "--settle", "10"])
    progress = rows(0, 20, 4, 0.5) + rows(20, 200, 3, 0.1)
    slices = bench.throughput(progress, 3, 0.0, args)
    assert slices == pytest.approx([3 * bench.BATCH / 0.1] * 6)
    with pytest.raises(ValueError, match="left size 4"):
        bench.throughput(rows(0, 30, 4, 0.1) + rows(30, 200, 3, 0.1), 4, 0.0, args)
    with pytest.raises(StopIteration):  # never at that size: the caller waits for it first
        bench.throughput(progress, 2, 0.0, args)


def test_the_report_judges_the_ratios_and_counts_false_drains(tmp_path, capsys):
    args = bench.parse_args(["--json", str(tmp_path / "straggler.json")])
    drain = {"event": "straggler_drain", "status": "requested", "slow_host": bench.SLOW, "time": 50.0}
    pace = [{"event": "pace", "time": t, "hosts": {bench.SLOW: {"ratio": r}, "hvdtb1": {"ratio": 1.0}}}
            for t, r in ((10, 3.0), (30, 3.1), (400, 1.0))]
    progress = rows(0, 60, 4, 0.25) + rows(60, 360, 3, 0.1) + rows(360, 480, 4, 0.1)
    runs = {"without": {"size3": [240.0] * 6, "events": [], "progress": rows(0, 9, 3, 0.1), "problems": []},
            "report": {"size4": [128.0] * 6, "events": [], "progress": rows(0, 9, 4, 0.25), "problems": []},
            "drain": {"size3": [236.0] * 6, "size4": [316.0] * 6, "asked": 50.0, "lifted": 150.0, "rejoined": 360.0,
                      "events": [drain, *pace], "progress": progress, "problems": []},
            "full": {"size4": [320.0] * 6, "events": [], "progress": rows(0, 9, 4, 0.1), "problems": []}}
    assert bench.report(args, runs, (1.0, 1.0, 1.0)) == 0
    result = json.loads((tmp_path / "straggler.json").read_text())
    assert result["drain_throughput_ratio"] == pytest.approx(236 / 240)
    assert result["report_throughput_ratio"] == pytest.approx(128 / 240)
    assert result["readmitted_throughput_ratio"] == pytest.approx(316 / 320)
    assert result["false_drains"] == 0 and result["readmitted_after_s"] == 310.0
    assert (tmp_path / "straggler.png").stat().st_size > 10_000
    assert "false drains 0" in capsys.readouterr().out

    runs["full"]["events"] = [dict(drain, slow_host="hvdtb2")]
    runs["drain"]["problems"] = ["samples trained twice"]
    assert bench.report(args, runs, (1.0, 1.0, 1.0)) == 1  # a verdict that failed fails the run
    assert json.loads((tmp_path / "straggler.json").read_text())["false_drains"] == 1
