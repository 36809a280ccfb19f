"""A small deterministic training job for the run-decorator tests.

Trains a tiny MLP with Horovod's DistributedOptimizer (SGD with momentum), a StepLR
scheduler and an ExactlyOnceSampler, committing after every step, under
``@hvd_elastic.run``.  With a fixed world size the trajectory is bitwise
deterministic, so a run that was killed and resumed must end with the same
parameters as one that was not.

Environment (all optional except OUT_DIR):
    OUT_DIR           rank 0 writes ``progress`` ({"step", "size"} after each step) and
                      ``result.json`` here; every worker writes ``worker-<host>-<local rank>.pid``
    CKPT_DIR          checkpoint directory            EVENT_LOG   event-log path
                      ("{host}" in CKPT_DIR becomes HOROVOD_HOSTNAME: a directory per host,
                      as node-local disks are, for the shared-directory check)
    CKPT_EVERY        checkpoint every N commits (5)  EPOCHS      epochs (3)
    STEP_SLEEP        seconds per step (0.05), so a test can kill the job mid-run
    SLOW_WRITES_FROM_STEP  from this step on, rank 0's checkpoint writes stall
                      (sets HVD_ELASTIC_CHECKPOINT_WRITE_DELAY), so a kill lands mid-write
    MPI_COMM          "1": hvd.init(comm=MPI.COMM_WORLD) (plain mpirun launch)
    STOP_FILE         train until this file exists (instead of for EPOCHS); the
                      decision is shared by an allreduce so all ranks stop together
    FAIL_ON_HOST      a worker started on this host (HOROVOD_HOSTNAME) exits with 3
                      before hvd.init(): a newcomer that never reaches its rendezvous
"""

import hashlib
import json
import os
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import horovod.torch as hvd

import hvd_elastic
from hvd_elastic.training.checkpoint import WRITE_DELAY_ENV
from hvd_elastic.training.sampler import ExactlyOnceSampler
from hvd_elastic.training.state import TrainingState

OUT_DIR = os.environ["OUT_DIR"]
EPOCHS = int(os.environ.get("EPOCHS", "3"))
STEP_SLEEP = float(os.environ.get("STEP_SLEEP", "0.05"))
SLOW_FROM = int(os.environ.get("SLOW_WRITES_FROM_STEP", "0")) or None
STOP_FILE = os.environ.get("STOP_FILE")


def stop_requested() -> bool:
    if STOP_FILE is None:
        return False
    flag = float(hvd.rank() == 0 and os.path.exists(STOP_FILE))
    return hvd.allreduce(torch.tensor([flag]), op=hvd.Max, name="stop").item() > 0


def params_sha256(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(bytes(tensor.detach().contiguous().view(torch.uint8).flatten().tolist()))
    return digest.hexdigest()


def main() -> None:
    fail_on = os.environ.get("FAIL_ON_HOST")
    if fail_on and fail_on == os.environ.get("HOROVOD_HOSTNAME"):
        raise SystemExit(3)
    if os.environ.get("MPI_COMM") == "1":
        from mpi4py import MPI

        hvd.init(comm=MPI.COMM_WORLD)
    else:
        hvd.init()
    host = os.environ.get("HOROVOD_HOSTNAME", "mpi")
    with open(os.path.join(OUT_DIR, f"worker-{host}-{hvd.local_rank()}.pid"), "w") as f:
        f.write(str(os.getpid()))
    torch.manual_seed(0)
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(256, 8, generator=generator)
    y = x @ torch.randn(8, 1, generator=generator) + 0.1 * torch.randn(256, 1, generator=generator)
    dataset = TensorDataset(x, y)

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                         named_parameters=model.named_parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.9)
    sampler = ExactlyOnceSampler(dataset, batch_size=8, seed=7)
    state = TrainingState(model=model, optimizer=optimizer, schedulers=[scheduler], sampler=sampler,
                          epoch=0, step=0)

    ckpt_dir = os.environ.get("CKPT_DIR")
    if ckpt_dir:
        ckpt_dir = ckpt_dir.replace("{host}", host)

    @hvd_elastic.run(checkpoint_dir=ckpt_dir,
                     checkpoint_every_commits=(int(os.environ.get("CKPT_EVERY", "5")) if os.environ.get("CKPT_DIR")
                                               else None),
                     keep_last=3, event_log=os.environ.get("EVENT_LOG"))
    def train(state):
        epochs = 10**6 if STOP_FILE else EPOCHS
        for state.epoch in range(state.epoch, epochs):
            sampler.set_epoch(state.epoch)
            for xb, yb in DataLoader(dataset, batch_sampler=sampler):
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(xb), yb).backward()
                optimizer.step()
                scheduler.step()
                sampler.record_batch()
                state.step += 1
                if SLOW_FROM is not None and state.step >= SLOW_FROM:
                    os.environ[WRITE_DELAY_ENV] = "120"
                if hvd.rank() == 0:
                    with open(os.path.join(OUT_DIR, "progress.tmp"), "w") as f:
                        json.dump({"step": state.step, "size": hvd.size()}, f)
                    os.replace(os.path.join(OUT_DIR, "progress.tmp"), os.path.join(OUT_DIR, "progress"))
                time.sleep(STEP_SLEEP)
                state.commit()
                if stop_requested():
                    return

    train(state)
    if hvd.rank() == 0:
        result = {"step": state.step, "epoch": state.epoch, "size": hvd.size(),
                  "lr": optimizer.param_groups[0]["lr"], "params_sha256": params_sha256(model),
                  "offset": sampler.offset}
        with open(os.path.join(OUT_DIR, "result.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
