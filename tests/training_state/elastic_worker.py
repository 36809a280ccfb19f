"""Elastic training worker for test_elastic.py (run by horovodrun, one per slot).

Trains a small model with Adam (Horovod DistributedOptimizer), a StepLR
scheduler, a CPU GradScaler and an ExactlyOnceSampler over a DataLoader with a
worker process, committing every step.  Files under ``$OUT``:

* ``ledger/<pid>.jsonl``: one record per batch, written BEFORE the step runs
  (so a worker killed mid-step leaves its record): the step key
  ``[epoch, offset, world_size, step_samples]``, the rank and the indices.
* the committed ``history`` user value lists the keys of every committed step;
  a record counts only if its key is in the final history, so steps rolled
  back by a crash never count (a replay of the same key has the same indices).
* ``pids/<pid>.json``: this worker's rank and world size since its last (re)start.
* ``progress.json`` (rank 0): committed steps and world size, for the test's schedule.
* ``final-<rank>.json``: checksums and scheduler/scaler states at the end.
* Steps sleep ``STEP_SLEEP`` seconds until ``$OUT/fast`` exists.
"""

import faulthandler
import hashlib
import json
import os
import signal
import time

import torch
from torch.utils.data import DataLoader, Dataset

import horovod.torch as hvd
from hvd_elastic.training.sampler import ExactlyOnceSampler
from hvd_elastic.training.state import TrainingState

OUT = os.environ["OUT"]
SAMPLES = int(os.environ.get("SAMPLES", "1920"))
EPOCHS = int(os.environ.get("EPOCHS", "2"))
BATCH = int(os.environ.get("BATCH", "4"))
STEP_SLEEP = float(os.environ.get("STEP_SLEEP", "0.15"))


class Indexed(Dataset):
    """Deterministic regression data that also returns each sample's index."""

    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x @ torch.arange(8.0) + 1.0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return i, self.x[i], self.y[i]


def write_atomic(path, obj):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def checksum(model, optimizer):
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(bytes(t.detach().contiguous().view(-1).view(torch.uint8).tolist()))
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in sorted(optimizer.state[p].items()):
                if torch.is_tensor(value):
                    h.update(key.encode())
                    h.update(bytes(value.detach().contiguous().view(-1).view(torch.uint8).tolist()))
    return h.hexdigest()


def main():
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints where a hung worker is
    hvd.init()
    os.makedirs(os.path.join(OUT, "ledger"), exist_ok=True)
    os.makedirs(os.path.join(OUT, "pids"), exist_ok=True)
    torch.manual_seed(1000 + os.getpid())  # deliberately different on every worker: sync must fix it
    dataset = Indexed(SAMPLES)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=25, gamma=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=10)
    sampler = ExactlyOnceSampler(dataset, BATCH, seed=7)
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=1, prefetch_factor=4,
                        collate_fn=ExactlyOnceSampler.collate())
    state = TrainingState(model=model, optimizer=optimizer, schedulers=[scheduler], scaler=scaler,
                          sampler=sampler, epoch=0, history=[])
    ledger = open(os.path.join(OUT, "ledger", f"{os.getpid()}.jsonl"), "a", buffering=1)
    empty = (torch.zeros(0, 8), torch.zeros(0))

    @hvd.elastic.run
    def train(state):
        write_atomic(os.path.join(OUT, "pids", f"{os.getpid()}.json"), {"rank": hvd.rank(), "size": hvd.size()})
        for state.epoch in range(state.epoch, EPOCHS):
            sampler.set_epoch(state.epoch)
            for batch in loader:
                key = [state.epoch, sampler.offset, hvd.size(), sampler.step_samples]
                indices, x, y = (batch if batch is not None else ([], *empty))
                ledger.write(json.dumps({"key": key, "rank": hvd.rank(), "idx": list(map(int, indices))}) + "\n")
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y, reduction="sum") / (BATCH * hvd.size())
                scaler.scale(loss).backward()
                optimizer.synchronize()
                with optimizer.skip_synchronize():
                    scaler.step(optimizer)
                scaler.update()
                scheduler.step()
                sampler.record_batch()
                state.history.append(key)
                state.commit()
                if hvd.rank() == 0:
                    write_atomic(os.path.join(OUT, "progress.json"),
                                 {"steps": len(state.history), "size": hvd.size()})
                if not os.path.exists(os.path.join(OUT, "fast")):
                    time.sleep(STEP_SLEEP)

    train(state)
    write_atomic(os.path.join(OUT, f"final-{hvd.rank()}.json"), {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "checksum": checksum(model, optimizer),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "lr": optimizer.param_groups[0]["lr"],
        "history": state.history if hvd.rank() == 0 else None,
        "samples": SAMPLES,
    })


if __name__ == "__main__":
    main()
