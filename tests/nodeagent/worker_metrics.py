"""Elastic worker for the metrics tests: ``@hvd_elastic.run`` over a TrainingState, one row per step.

The steps and their rows are ``worker_sizes.train_until_stopped``'s (every rank
appends {pid, host, rank, size, step, time} to ``$SIZES_DIR/sizes.<pid>.jsonl``;
all ranks stop once ``$SIZES_DIR/stop`` exists), each ending in
``state.commit_step()``; rank 0's event log is ``$SIZES_DIR/events.jsonl``.
Metrics are served as ``HVD_ELASTIC_METRICS_ADDR`` says (the runner reads it).
"""

from __future__ import annotations

import os

import horovod.torch as hvd
import torch
from worker_sizes import SIZES_DIR, train_until_stopped  # this script's folder is sys.path[0]

import hvd_elastic
from hvd_elastic.training.sampler import ExactlyOnceSampler


def main() -> None:
    hvd.init()
    torch.set_num_threads(1)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    sampler = ExactlyOnceSampler(100_000, batch_size=4, seed=0)
    state = hvd_elastic.TrainingState(model=model, optimizer=optimizer, sampler=sampler, step=0)
    hvd_elastic.run(event_log=os.path.join(SIZES_DIR, "events.jsonl"))(train_until_stopped)(state, state.commit_step)


if __name__ == "__main__":
    main()
