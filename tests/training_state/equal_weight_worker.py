"""Worker of test_equal_weight.py: the examples' loss scale against a mean loss, at a static world of 3.

``python equal_weight_worker.py OUT`` under ``horovodrun -np 3``.  One sampler
drives two copies of the same model through the same batches:

* ``scaled``: the examples' pattern, a summed loss divided by
  ``sampler.samples_this_step`` with ``op=hvd.Sum``;
* ``mean``: the pattern the examples used before, a mean loss with Horovod's
  default ``op=hvd.Average``.

Epoch 0 takes ``STEP`` = 10 samples a step (split 4, 3, 3 over the ranks) and
ends with a step that absorbs the remainder (7: split 3, 2, 2).  Epoch 1 starts
``IDLE_OFFSET`` samples in, as a world of 3 resuming a smaller world's commit
with 2 samples left: ranks 0 and 1 get one sample each, rank 2 is idle.

Each rank writes ``OUT/rank-<r>.json``: every step's epoch, offset and this
rank's sample indices, and the final parameters of both models (float64, so
the comparison measures weighting, not rounding).
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

SAMPLES = 47
STEP = 10
IDLE_OFFSET = 45
LR = 0.1
SAMPLER_SEED = 3


def data() -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) in float64, the same in every process."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, 5, generator=g, dtype=torch.float64)
    y = torch.sin(x @ torch.randn(5, 1, generator=g, dtype=torch.float64))
    return x, y


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()


def flat(model: torch.nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def main(out: str) -> None:
    import horovod.torch as hvd

    from hvd_elastic import BatchPolicy, ExactlyOnceSampler, TrainingState

    hvd.init()
    torch.set_num_threads(1)
    x, y = data()
    dataset = TensorDataset(torch.arange(SAMPLES), x, y)
    models = {"scaled": make_model(), "mean": make_model()}
    ops = {"scaled": hvd.Sum, "mean": hvd.Average}
    optimizers = {
        name: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR), op=ops[name],
                                       named_parameters=[(f"{name}.{n}", p) for n, p in model.named_parameters()])
        for name, model in models.items()
    }
    sampler = ExactlyOnceSampler(dataset, seed=SAMPLER_SEED)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=ExactlyOnceSampler.collate())
    TrainingState(model=models["scaled"], optimizer=optimizers["scaled"], sampler=sampler, rng=False,
                  batch_policy=BatchPolicy.constant_global(STEP))
    steps = []
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        if epoch == 1:
            sampler.load_state_dict({**sampler.state_dict(), "offset": IDLE_OFFSET})
        for batch in loader:
            steps.append({"epoch": epoch, "offset": sampler.offset, "idx": [] if batch is None else batch[0].tolist()})
            for name, model in models.items():
                optimizer = optimizers[name]
                optimizer.zero_grad()
                if batch is not None:
                    _, xb, yb = batch
                    if name == "scaled":
                        loss = torch.nn.functional.mse_loss(model(xb), yb, reduction="sum") / sampler.samples_this_step
                    else:
                        loss = torch.nn.functional.mse_loss(model(xb), yb)
                    loss.backward()
                optimizer.step()  # an idle rank too: it joins the allreduce with zero gradients
            sampler.record_batch()
    with open(os.path.join(out, f"rank-{hvd.rank()}.json"), "w") as f:
        json.dump({"rank": hvd.rank(), "size": hvd.size(), "steps": steps,
                   "params": {name: flat(model) for name, model in models.items()}}, f)


if __name__ == "__main__":
    main(sys.argv[1])
