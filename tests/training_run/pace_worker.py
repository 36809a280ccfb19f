"""The straggler tests' training job: ``STEPS`` steps of real CPU work, one epoch, under ``@hvd_elastic.run``.

A three-layer MLP on random data with Horovod's DistributedOptimizer and an ExactlyOnceSampler,
committing every step (``state.commit_step()``), one torch thread per rank, no sleeps: a step is
CPU work (forward, backward, the gradient allreduce), so a throttled rank is really slower.

Environment:
    EVENT_LOG      the event log (the straggler settings come as ``HVD_ELASTIC_STRAGGLER*`` variables)
    STEPS          global steps to train (200) at the first world's size, or
    SAMPLES        ... samples to train (a job whose size changes: every rank must agree on them)
    BATCH          samples per rank per step (1024)
    SLOW_HOST      the worker on this host (``HOROVOD_HOSTNAME``) is made slow, by
    SLOW_CGROUP    ... moving itself into this cgroup v1 cpu group (the test set its CFS quota), or
    SLOW_FACTOR    ... without a cgroup: spinning the CPU after each backward pass for (factor - 1) times
                   the pass's own time
"""

import os
import time

import torch
from torch.utils.data import DataLoader, Dataset

import horovod.torch as hvd

import hvd_elastic
from hvd_elastic.training.sampler import ExactlyOnceSampler
from hvd_elastic.training.state import TrainingState

STEPS = int(os.environ.get("STEPS", "200"))
BATCH = int(os.environ.get("BATCH", "1024"))
WIDTH = 256


def slow_down() -> float:
    """Make this process slow when it runs on SLOW_HOST; the spin factor (1.0: no spinning)."""
    if os.environ.get("HOROVOD_HOSTNAME") != os.environ.get("SLOW_HOST"):
        return 1.0
    group = os.environ.get("SLOW_CGROUP")
    if group:
        with open(os.path.join(group, "cgroup.procs"), "w") as f:  # every thread, and those started later
            f.write(str(os.getpid()))
        return 1.0
    return float(os.environ.get("SLOW_FACTOR", "1"))


class Cycled(Dataset):
    """``samples`` samples cycling over a small random set: real batches in little memory, fetched whole."""

    def __init__(self, samples: int, distinct: int = 4096):
        self.samples = samples
        self.x, self.y = torch.randn(distinct, WIDTH), torch.randn(distinct, 1)

    def __len__(self) -> int:
        return self.samples

    def __getitems__(self, indices: list[int]) -> list:
        rows = torch.tensor(indices, dtype=torch.long) % len(self.x)
        return [(self.x[rows], self.y[rows])] if indices else []  # one item: the whole batch (empty: idle)


def spin(seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def stop_now() -> bool:
    """After the first epoch, whether rank 0 sees ``$STOP_FILE`` (every rank gets its answer: all stop together);
    without ``STOP_FILE``, one epoch."""
    stop_file = os.environ.get("STOP_FILE")
    return not stop_file or hvd.broadcast_object(os.path.exists(stop_file), root_rank=0, name="stop")


def main() -> None:
    hvd.init()
    torch.set_num_threads(1)
    factor = slow_down()
    torch.manual_seed(0)
    samples = int(os.environ.get("SAMPLES") or STEPS * BATCH * hvd.size())
    dataset = Cycled(samples)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH),
                                torch.nn.ReLU(), torch.nn.Linear(WIDTH, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.001),
                                         named_parameters=model.named_parameters(), op=hvd.Sum)
    sampler = ExactlyOnceSampler(dataset, batch_size=BATCH, seed=1)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=ExactlyOnceSampler.collate(lambda items: items[0]))
    state = TrainingState(model=model, optimizer=optimizer, sampler=sampler, epoch=0, step=0)

    @hvd_elastic.run(event_log=os.environ["EVENT_LOG"])
    def train(state):
        while state.epoch < 1 or not stop_now():
            sampler.set_epoch(state.epoch)
            for batch in loader:
                optimizer.zero_grad()
                if batch is not None:
                    started = time.perf_counter()
                    x, y = batch
                    loss = torch.nn.functional.mse_loss(model(x), y, reduction="sum") / sampler.samples_this_step
                    loss.backward()
                    spin((factor - 1) * (time.perf_counter() - started))
                optimizer.step()
                state.commit_step()
            state.epoch += 1
            state.commit()

    train(state)


if __name__ == "__main__":
    main()
