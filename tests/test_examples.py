"""The scripts in examples/ train to the end under elastic horovodrun, and ``hvd-elastic report`` reads their runs.

Membership comes from a host file (Horovod's own way); the demo's test covers Consul and resizes.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hvd_elastic.testbed import REPO, Job, child_env, horovodrun_elastic, host_file_discovery


@pytest.mark.slow
@pytest.mark.parametrize("script, flags, steps", [
    ("minimal.py", ["--epochs", "2"], 2 * 1024 // 16 // 2),  # batch 16 per rank, two ranks
    ("train_elastic.py", ["--epochs", "2", "--samples", "512"], 2 * 512 // 32),  # global batch 32
])
def test_example_trains_to_the_end_and_report_reads_its_run(tmp_path, script, flags, steps):
    discovery = host_file_discovery(tmp_path / "hosts", "localhost:1\n127.0.0.1:1\n")
    run_dir = tmp_path / "run"
    cmd = [*horovodrun_elastic(discovery, 2, 1, 2), sys.executable, REPO / "examples" / script,
           "--workdir", run_dir, *flags]
    with Job(cmd, env=child_env(), logdir=tmp_path, name=script) as job:
        job.start()
        job.finish(timeout=420)
        log = job.read_log()
    assert f"training finished: epoch 2, step {steps}" in log, log[-3000:]
    if script == "train_elastic.py":
        rows = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
        assert rows[-1]["step"] == steps and {"time", "loss", "size"} <= set(rows[-1])

    out = subprocess.run([sys.executable, "-m", "hvd_elastic.cli", "report", str(run_dir)],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert "0 membership changes" in out.stdout and "training finished" in out.stdout
    if script == "train_elastic.py":
        assert f"last committed step {steps} at world size 2" in out.stdout
    assert (run_dir / "report.png").read_bytes()[:4] == b"\x89PNG"
