"""The demo's training job: a small CNN on scikit-learn's bundled ``digits`` images, elastic, leaving evidence.

Elastic, one process per slot (what ``hvd-elastic demo`` runs)::

    horovodrun -np 2 --min-np 1 --max-np 3 --host-discovery-script consul_hosts \\
        python -m hvd_elastic.demo.train --out RUN_DIR

or as ONE plain process, no launcher: the uninterrupted reference run, same code,
same data order, same global batch.

The data ship with scikit-learn (1797 8x8 images, no download; :mod:`.digits`): a
fixed split keeps 360 for the accuracy test.  Every step takes
``GLOBAL_BATCH`` samples whatever the world size (``BatchPolicy.constant_global``);
gradients are SUMMED across ranks of a loss already divided by the step's
samples, so a step's update is the same however the step is split, and an
elastic run can match the reference.  The LR follows a cosine schedule over the
whole run; rank 0 checkpoints every ``--checkpoint-every`` commits.

Files in RUN_DIR: the evidence of :mod:`hvd_elastic.report.evidence` (``ledger/``,
``progress.jsonl``, here with ``loss``; ``events.jsonl``, ``ckpt/``,
``final-<rank>.json``, ``pids/``) and ``result.json`` (rank 0: test accuracy).
Each step sleeps ``--step-delay`` seconds until ``RUN_DIR/fast`` exists, so the
demo's events land mid-run and the rest runs at full speed.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset

import horovod.torch as hvd

import hvd_elastic
from hvd_elastic import BatchPolicy, ExactlyOnceSampler, TrainingState
from hvd_elastic.options import non_negative_seconds, positive_int
from hvd_elastic.report.evidence import Evidence, write_atomic, write_final

from .digits import GLOBAL_BATCH, RESULT, load_split, steps_per_epoch

MODEL_SEED = 0
SAMPLER_SEED = 7


class Indexed(Dataset):
    """(index, image, label): the index goes into the ledger."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return i, self.images[i], self.labels[i]


def make_model() -> torch.nn.Module:
    torch.manual_seed(MODEL_SEED)  # the same initial weights in the elastic and the reference run
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 4 * 4, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    with torch.no_grad():
        return (model(images).argmax(1) == labels).float().mean().item()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hvd_elastic.demo.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="run directory (shared by every rank)")
    parser.add_argument("--epochs", type=positive_int, default=3, help="epochs over the training split")
    parser.add_argument("--lr", type=float, default=0.05, help="peak learning rate (SGD with momentum)")
    parser.add_argument("--step-delay", type=non_negative_seconds, default=0.0,
                        help="seconds each step sleeps until RUN_DIR/fast exists")
    parser.add_argument("--checkpoint-every", type=positive_int, default=10, help="commits between checkpoints")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    hvd.init()
    torch.set_num_threads(1)  # several ranks share a few cores
    evidence = Evidence(args.out)
    evidence.initialised = time.time()
    (train_x, train_y), (test_x, test_y) = load_split()
    dataset = Indexed(train_x, train_y)
    model = make_model()
    # Sum, not average: each rank's loss is already a share of the step's mean loss.
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
                                         named_parameters=model.named_parameters(), op=hvd.Sum)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * steps_per_epoch(len(dataset)))
    sampler = ExactlyOnceSampler(dataset, seed=SAMPLER_SEED)  # no batch_size: the BatchPolicy sets the step
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=ExactlyOnceSampler.collate())
    state = TrainingState(model=model, optimizer=optimizer, schedulers=[scheduler], sampler=sampler,
                          batch_policy=BatchPolicy.constant_global(GLOBAL_BATCH), epoch=0, step=0, history=[],
                          digests=[])
    empty: tuple[list[int], torch.Tensor, torch.Tensor] = ([], torch.zeros(0, 1, 8, 8),
                                                           torch.zeros(0, dtype=torch.int64))

    @hvd_elastic.run(checkpoint_dir=os.path.join(args.out, "ckpt"), checkpoint_every_commits=args.checkpoint_every,
                     event_log=os.path.join(args.out, "events.jsonl"))
    def train(state: TrainingState) -> None:
        evidence.started()
        while state.epoch < args.epochs:
            sampler.set_epoch(state.epoch)
            for batch in loader:
                indices, x, y = batch if batch is not None else empty
                evidence.tracked_batch(state, sampler, indices)
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y, reduction="sum") / sampler.samples_this_step
                loss.backward()
                optimizer.step()
                scheduler.step()
                evidence.applied(state)
                step_loss = hvd.allreduce(loss.detach(), op=hvd.Sum, name="loss").item()
                state.commit_step()  # sampler position, step count, commit
                evidence.committed(state.step, state.epoch, loss=round(step_loss, 6))
                evidence.pause(args.step_delay)
            state.epoch += 1
            state.commit()

    train(state)
    write_final(args.out, model, optimizer, scheduler, state, len(dataset))
    if hvd.rank() == 0:
        write_atomic(os.path.join(args.out, RESULT), {
            "accuracy": accuracy(model, test_x, test_y), "test_samples": len(test_y), "epochs": state.epoch,
            "steps": state.step, "world_size": hvd.size()})


if __name__ == "__main__":
    main()
