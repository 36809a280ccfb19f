"""The README's main command: the elastic demo, end to end, through real processes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hvd_elastic.training.events import EventLog


@pytest.mark.slow
def test_demo_shrinks_grows_and_resumes(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "hvd_elastic.cli", "demo", "--workdir", str(tmp_path),
         "--epochs", "2", "--samples", "1536", "--phase-steps", "8"],
        capture_output=True, text=True, timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "demo OK" in out.stdout
    events = EventLog.read(tmp_path / "events.jsonl")
    resets = [(e["reason"], e.get("hosts"), e["old_size"], e["new_size"]) for e in events if e["event"] == "reset"]
    assert resets[:2] == [("hosts_updated", "removed", 2, 1), ("hosts_updated", "added", 1, 2)]
    # The drain was graceful: nothing was rolled back before the growth.
    before_growth = events[: next(i for i, e in enumerate(events) if e["event"] == "reset" and e["hosts"] == "added")]
    assert not any(e["event"] == "restore" for e in before_growth)
    resume = next(e for e in events if e["event"] == "resume")
    assert resume["step"] > 0
    assert events[-1]["event"] == "finish"
    # The progress log ends at the last step of the last epoch: 2 epochs of 1536 samples at 32 per step.
    steps = [json.loads(line)["step"] for line in open(tmp_path / "progress.jsonl")]
    assert steps[-1] == 2 * 1536 // 32
