"""The scripts in examples/ train to the end under elastic horovodrun, and ``hvd-elastic report`` reads their runs.

Membership comes from a host file (Horovod's own way); the demo's test covers Consul and resizes.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from testbed import REPO, Job, child_env, horovodrun_elastic, host_file_discovery

#: The scripts users copy: the examples, and the demo's job.
PATTERNS = sorted((REPO / "examples").glob("*.py")) + [REPO / "hvd_elastic" / "demo" / "train.py"]


@pytest.mark.parametrize("script", PATTERNS, ids=lambda p: p.name)
def test_scripts_weigh_every_sample_equally_with_the_samplers_loss_scale(script):
    """Every loss is summed and divided by ``sampler.samples_this_step``, and every ``DistributedOptimizer``
    sums (``op=hvd.Sum``): the pattern tests/training_state/test_equal_weight.py shows equal to one process.
    Before, the examples took a mean loss under the default ``hvd.Average``, which weighs a sample more
    on a rank whose batch is shorter, and dilutes a step with idle ranks."""
    tree = ast.parse(script.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def name(call: ast.Call) -> str:
        return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")

    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    losses = [c for c in calls if name(c).endswith("_loss") or name(c) == "cross_entropy"]
    optimizers = [c for c in calls if name(c) == "DistributedOptimizer"]
    assert losses and optimizers, f"{script.name}: no loss or no DistributedOptimizer found"
    for loss in losses:
        where = f"{script.name}:{loss.lineno}"
        reduction = {k.arg: k.value for k in loss.keywords}.get("reduction")
        assert isinstance(reduction, ast.Constant) and reduction.value == "sum", f"{where}: loss is not summed"
        scale = parents.get(loss)
        assert (isinstance(scale, ast.BinOp) and isinstance(scale.op, ast.Div) and scale.left is loss
                and ast.unparse(scale.right) == "sampler.samples_this_step"), \
            f"{where}: the summed loss is not divided by sampler.samples_this_step"
    for optimizer in optimizers:
        op = {k.arg: k.value for k in optimizer.keywords}.get("op")
        assert op is not None and ast.unparse(op) == "hvd.Sum", f"{script.name}:{optimizer.lineno}: op is not hvd.Sum"


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
