"""Static 2-rank worker for test_rank_streams.py: RNG streams after ``TrainingState.sync()``.

Both ranks start from the SAME seeds (as a job that seeds everything alike for
identical weights does).  Each rank writes ``$OUT/streams-<rank>.json`` with
draws of torch, Python and NumPy after a sync, and again after restore() and a
second sync (which must repeat the first: restores stay deterministic).
"""

import json
import os
import random

import numpy
import torch

import horovod.torch as hvd
from hvd_elastic.training.state import TrainingState

OUT = os.environ["OUT"]


def draws():
    return [torch.rand(3).tolist(), random.random(), float(numpy.random.random())]


def main():
    hvd.init()
    torch.manual_seed(0)
    random.seed(0)
    numpy.random.seed(0)
    state = TrainingState(model=torch.nn.Linear(2, 2), rng=True)
    state.sync()
    first = draws()
    state.restore()
    state.sync()
    again = draws()
    with open(os.path.join(OUT, f"streams-{hvd.rank()}.json"), "w") as f:
        json.dump({"first": first, "again": again}, f)


if __name__ == "__main__":
    main()
