"""Elastic PyTorch training with hvd-elastic: the pattern to copy.

Launch it with horovodrun's elastic mode and Consul discovery::

    horovodrun -np 2 --min-np 1 --max-np 4 \\
        --host-discovery-script discovery/consul_hosts \\
        python examples/train_elastic.py --workdir /shared/run1

It trains a small regression MLP on a synthetic, deterministic dataset, with
an LR schedule, a global batch kept constant across resizes, mixed precision
(AMP with a ``GradScaler``) where CUDA exists, and torchdata's
``StatefulDataLoader`` with worker processes when torchdata is installed
(``pip install hvd-elastic[torchdata]``; else a plain ``DataLoader``). Hosts
may join or leave at any time (drain a node with ``hvd-elastic drain``), and a
killed job restarted with the same ``--workdir`` resumes from its last durable
checkpoint. ``run(progress_log=...)`` has rank 0 append one ``{"time", "size",
"step", "epoch", "loss", ...}`` line per commit to ``<workdir>/progress.jsonl``
(the state's numeric values: ``loss`` is one, set before each commit); ``<workdir>/events.jsonl`` holds
the resets, syncs and checkpoint writes; ``hvd-elastic report <workdir>`` shows both.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset

try:  # its iterator state is checkpointable too; the ExactlyOnceSampler position is what TrainingState commits
    from torchdata.stateful_dataloader import StatefulDataLoader as Loader
except ImportError:
    Loader = DataLoader

import horovod.torch as hvd

import hvd_elastic
from hvd_elastic import BatchPolicy, ExactlyOnceSampler, TrainingState


class SyntheticRegression(Dataset):
    """``y = x @ w_true + noise``, generated from the index so every rank agrees."""

    def __init__(self, num_samples: int, features: int = 16, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(num_samples, features, generator=generator)
        w_true = torch.randn(features, 1, generator=generator)
        self.y = self.x @ w_true + 0.01 * torch.randn(num_samples, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        return self.x[index], self.y[index]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="checkpoints, event log and progress log go here")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=2048, help="dataset size")
    parser.add_argument("--global-batch", type=int, default=32, help="samples per step, kept constant on resize")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--step-delay", type=float, default=0.0,
                        help="extra seconds per step, to stand in for real compute (demo)")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="commits between durable checkpoints")
    parser.add_argument("--loader-workers", type=int, default=2, help="data loader worker processes per rank")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    hvd.init()
    torch.manual_seed(0)

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", hvd.local_rank()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dataset = SyntheticRegression(args.samples)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
    # op=hvd.Sum with each rank's loss divided by the step's GLOBAL sample count (below): every
    # sample weighs the same, however unevenly a step is split (hvd.Average would not).
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
                                         named_parameters=model.named_parameters(), op=hvd.Sum)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    sampler = ExactlyOnceSampler(dataset, seed=1)  # no batch_size: the BatchPolicy below sets the batch
    loader = Loader(dataset, batch_sampler=sampler, collate_fn=ExactlyOnceSampler.collate(),
                    num_workers=args.loader_workers)
    scaler = torch.amp.GradScaler("cuda", enabled=cuda)  # AMP only where CUDA exists; a no-op on CPU
    state = TrainingState(model=model, optimizer=optimizer, schedulers=[scheduler], scaler=scaler, sampler=sampler,
                          batch_policy=BatchPolicy.constant_global(args.global_batch), epoch=0, step=0, loss=0.0)

    @hvd_elastic.run(checkpoint_dir=os.path.join(args.workdir, "checkpoints"),
                     checkpoint_every_commits=args.checkpoint_every,
                     event_log=os.path.join(args.workdir, "events.jsonl"),
                     progress_log=os.path.join(args.workdir, "progress.jsonl"))
    def train(state: TrainingState) -> None:
        while state.epoch < args.epochs:
            sampler.set_epoch(state.epoch)
            for batch in loader:
                optimizer.zero_grad()
                if batch is None:  # an idle final step: this rank has no sample left
                    loss = torch.zeros((), device=device)
                else:
                    x, y = (t.to(device, non_blocking=True) for t in batch)
                    with torch.autocast(device.type, enabled=cuda):
                        loss = torch.nn.functional.mse_loss(model(x), y, reduction="sum") / sampler.samples_this_step
                    scaler.scale(loss).backward()
                if cuda:
                    # Horovod's DistributedOptimizer: finish the gradient allreduce before unscaling.
                    optimizer.synchronize()
                    scaler.unscale_(optimizer)
                    with optimizer.skip_synchronize():
                        scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                state.loss = hvd.allreduce(loss.detach(), op=hvd.Sum, name="loss").item()  # the step's mean loss
                time.sleep(args.step_delay)
                state.commit_step()  # the step is done: sampler position, step count, commit (and progress row)
            scheduler.step()
            state.epoch += 1
            state.commit()

    train(state)
    if hvd.rank() == 0:
        print(f"training finished: epoch {state.epoch}, step {state.step}, world size {hvd.size()}", flush=True)


if __name__ == "__main__":
    main()
