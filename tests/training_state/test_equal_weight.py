"""The examples' loss scale weighs every sample equally: a world of 3 trains as one process would.

A static ``horovodrun -np 3`` runs equal_weight_worker.py: steps of 10 samples split 4, 3, 3, an
epoch tail of 7 split 3, 2, 2 and a last step of 2 samples where rank 2 is idle.  With the loss
``sum / sampler.samples_this_step`` and ``op=hvd.Sum`` its parameters equal those of ONE process
taking a mean loss over the same global batches, to float64 rounding.  The pattern the examples
had before (a mean loss per rank, ``op=hvd.Average``) misses that reference by orders of magnitude
more, so the comparison can tell the two apart.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from testbed import VENV_BIN, Job, child_env

import equal_weight_worker as worker

pytestmark = pytest.mark.slow

WORKER = Path(__file__).parent / "equal_weight_worker.py"
TOLERANCE = 1e-12  # float64: rounding of a few dozen sums, far below any weighting error


def reference(global_batches: list[list[int]]) -> list[float]:
    """One process, plain SGD on a mean loss over each global batch: every sample weighs the same."""
    x, y = worker.data()
    model = worker.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=worker.LR)
    for batch in global_batches:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x[batch]), y[batch]).backward()
        optimizer.step()
    return worker.flat(model)


def max_difference(a: list[float], b: list[float]) -> float:
    return (torch.tensor(a, dtype=torch.float64) - torch.tensor(b, dtype=torch.float64)).abs().max().item()


def test_world_of_3_with_uneven_and_idle_ranks_matches_one_process(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    cmd = [str(VENV_BIN / "horovodrun"), "-np", "3", "-H", "localhost:3", sys.executable, WORKER, out]
    with Job(cmd, env=child_env(HOROVOD_GLOO_TIMEOUT_SECONDS="60"), logdir=tmp_path, name="equal-weight") as job:
        job.start().finish(timeout=300)
    ranks = sorted((json.loads(p.read_text()) for p in out.glob("rank-*.json")), key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1, 2] and {r["size"] for r in ranks} == {3}

    # The split the test is about: uneven full steps, an uneven tail, then an idle rank.
    keys = [[(step["epoch"], step["offset"]) for step in r["steps"]] for r in ranks]
    assert keys == [[(0, 0), (0, 10), (0, 20), (0, 30), (0, 40), (1, worker.IDLE_OFFSET)]] * 3, keys
    sizes = [[len(r["steps"][k]["idx"]) for r in ranks] for k in range(len(keys[0]))]
    assert sizes == [[4, 3, 3]] * 4 + [[3, 2, 2]] + [[1, 1, 0]], sizes
    global_batches = [sorted(i for r in ranks for i in r["steps"][k]["idx"]) for k in range(len(sizes))]
    epoch0 = [i for batch in global_batches[:5] for i in batch]
    assert sorted(epoch0) == list(range(worker.SAMPLES)) and len(global_batches[5]) == 2

    expected = reference(global_batches)
    scaled = max(max_difference(r["params"]["scaled"], expected) for r in ranks)
    assert scaled < TOLERANCE, f"parameters differ from one process by up to {scaled:.3e}"
    mean = max_difference(ranks[0]["params"]["mean"], expected)
    print(f"max |parameter difference| from one process: samples_this_step + Sum {scaled:.3e}, "
          f"mean loss + Average {mean:.3e}")
    assert mean > 1e6 * TOLERANCE, f"the mean-loss pattern came within {mean:.3e}: the batches are not uneven enough"
