"""Static 2-rank worker for test_sync.py: rank 0 has trained, rank 1 is brand new.

After ``TrainingState.sync()`` each rank writes ``$OUT/sync-<rank>.json`` with
digests of everything that must now be equal, plus facts about rank 1's
optimizer state (created by the sync, not by a dummy ``optimizer.step()``).
"""

import hashlib
import json
import os
import random

import torch

import horovod.torch as hvd
from hvd_elastic.training.sampler import ExactlyOnceSampler
from hvd_elastic.training.state import TrainingState

OUT = os.environ["OUT"]


def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(bytes(t.detach().contiguous().view(-1).view(torch.uint8).tolist()))
    return h.hexdigest()


def moments_placed_and_private(model, optimizer, state):
    """Every moment sits on its parameter's device in memory of its own.

    A moment the sync created must not be a view of the commit buffer it came
    from (the next training step would then rewrite the committed copy, and
    restore() would bring back nothing), nor of its parameter.
    """
    committed = {s.untyped_storage().data_ptr() for s in state._buffer.storage.values()}
    for p in model.parameters():
        for name in ("exp_avg", "exp_avg_sq"):
            moment = optimizer.state[p][name]
            storage = moment.untyped_storage().data_ptr()
            if moment.device != p.device or storage in committed or storage == p.untyped_storage().data_ptr():
                return False
    return True


def main():
    hvd.init()
    rank = hvd.rank()
    torch.manual_seed(rank)  # different weights and RNG streams on each rank
    random.seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 3))
    # AdamW's decoupled weight decay moves parameters even on a zero gradient: a
    # dummy step on the new rank would make it diverge from rank 0.
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.5)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.8)
    sampler = ExactlyOnceSampler(100, 5)
    state = TrainingState(model=model, optimizer=optimizer, schedulers=[scheduler], sampler=sampler,
                          bucket_bytes=512, epoch=0, best=None)
    if rank == 0:  # rank 0 has trained for a while
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(16, 6)).pow(2).mean().backward()
            optimizer.step()
            scheduler.step()
            sampler.record_batch()
        state.epoch, state.best = 2, {"loss": 0.25, "at": [2, 7]}
    before = [p.clone() for p in model.parameters()]
    state.sync()
    # The sync is now this rank's commit: training more and restoring comes back here.
    params_after_sync = digest(model.parameters())
    optimizer.zero_grad()
    model(torch.randn(4, 6)).sum().backward()
    optimizer.step()
    state.restore()
    opt_tensors = [v for p in model.parameters() for _, v in sorted(optimizer.state[p].items())]
    report = {
        "rank": rank,
        "params": digest(model.parameters()),
        "params_after_sync": params_after_sync,
        "buffers": digest(model.buffers()),
        "optimizer": digest(opt_tensors),
        "optimizer_keys": sorted(sorted(optimizer.state[p]) for p in model.parameters()),
        "moment_devices_shared": moments_placed_and_private(model, optimizer, state),
        "lr": optimizer.param_groups[0]["lr"],
        "scheduler": scheduler.state_dict(),
        "sampler": sampler.state_dict(),
        "values": state.values,
        "rng": [torch.rand(2).tolist(), random.random()],
        "changed_by_sync": any(not torch.equal(a, b) for a, b in zip(before, model.parameters())),
        "buckets": len(state._buffer.buckets(512)),
    }
    with open(os.path.join(OUT, f"sync-{rank}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
