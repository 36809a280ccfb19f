"""The README's main command: the elastic demo, end to end, through real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

from hvd_elastic.training.events import EventLog

# Below pytest's own 600 s timeout (pyproject.toml), so that on a hang this test,
# not pytest, stops the demo and everything it started.
DEMO_WAIT_S = 540
# Each demo phase's own limit: its six phases (two for the restarted job) fit in
# DEMO_WAIT_S, so a stuck phase is reported by the demo, naming it.
PHASE_TIMEOUT_S = 80
# Inherited by every process the demo starts (node agents, horovodrun, its
# workers and discovery calls), so even those that left the demo's process tree
# are found.  Also keeps discovery's first-call markers in this test's tmp dir.
MARKER = "HVD_ELASTIC_DISCOVERY_STATE_DIR"


def _started_by(proc: subprocess.Popen, marker: str) -> list[psutil.Process]:
    found = {}
    try:
        found.update((p.pid, p) for p in psutil.Process(proc.pid).children(recursive=True))
    except psutil.NoSuchProcess:
        pass
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARKER) == marker:
                found[p.pid] = p
        except psutil.Error:  # gone, a zombie, or not ours to read
            continue
    found.pop(os.getpid(), None)
    return list(found.values())


def _reap(proc: subprocess.Popen, marker: str, grace: float) -> list[str]:
    """Give the demo's processes ``grace`` seconds to end, then SIGKILL the rest; their command lines."""
    procs = _started_by(proc, marker)
    _, alive = psutil.wait_procs(procs, timeout=grace)
    lingering = []
    for p in alive:
        try:
            lingering.append(" ".join(p.cmdline())[:200])
            p.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(alive, timeout=10)
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    return lingering


@pytest.mark.slow
def test_demo_shrinks_grows_and_resumes(tmp_path):
    marker = str(tmp_path / "discovery-state")
    log_path = tmp_path / "demo.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hvd_elastic.cli", "demo", "--workdir", str(tmp_path / "work"),
             "--epochs", "2", "--samples", "1536", "--phase-steps", "8", "--timeout", str(PHASE_TIMEOUT_S)],
            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, **{MARKER: marker}), start_new_session=True)
    code = None
    try:
        code = proc.wait(timeout=DEMO_WAIT_S)
    except subprocess.TimeoutExpired:
        pass
    finally:
        # A finished demo must have ended what it started: a short grace, then anything left is a leak.
        lingering = _reap(proc, marker, grace=10 if code is not None else 0)
    output = log_path.read_text()
    assert code is not None, f"demo still running after {DEMO_WAIT_S}s (killed):\n{output[-3000:]}"
    assert code == 0, output[-6000:]
    assert "demo OK" in output
    assert not lingering, f"processes left running after the demo exited: {lingering}"

    work = tmp_path / "work"
    events = EventLog.read(work / "events.jsonl")
    resets = [(e["reason"], e.get("hosts"), e["old_size"], e["new_size"]) for e in events if e["event"] == "reset"]
    assert resets[:2] == [("hosts_updated", "removed", 2, 1), ("hosts_updated", "added", 1, 2)]
    # The drain was graceful: nothing was rolled back before the growth.
    before_growth = events[: next(i for i, e in enumerate(events) if e["event"] == "reset" and e["hosts"] == "added")]
    assert not any(e["event"] == "restore" for e in before_growth)
    resume = next(e for e in events if e["event"] == "resume")
    assert resume["step"] > 0
    assert events[-1]["event"] == "finish"
    # The progress log ends at the last step of the last epoch: 2 epochs of 1536 samples at 32 per step.
    steps = [json.loads(line)["step"] for line in open(work / "progress.jsonl")]
    assert steps[-1] == 2 * 1536 // 32
    # Discovery kept its first-call markers here, not in a shared /tmp path.
    assert os.listdir(marker)
