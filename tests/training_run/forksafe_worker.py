"""Training worker of the fork-safety tests and benchmark (run by horovodrun, one per slot).

Trains a tiny model under ``@hvd_elastic.run`` with a ``TrainingState`` and an
``ExactlyOnceSampler`` feeding one DataLoader configuration after another
(``LOADERS``, names of :data:`LOADER_CONFIGS`), ``EPOCHS`` epochs each,
committing every step.

Environment:
    OUT          output folder (files below)
    LOADERS      comma-separated configuration names (default ``w2``)
    EPOCHS       epochs per configuration (1)        SAMPLES  samples per epoch (64)
    BATCH        samples per rank per step (4)      STEP_SLEEP  seconds per step until ``$OUT/fast`` exists (0.02)
    LEDGER       "0": no ledger and no committed history (the benchmark's long runs)
    FORK_HELPER  "1": once the state exists, start two helpers that live until ``$OUT/release``
                 exists: a bare ``os.fork()`` child with its output pointed at /dev/null (the
                 recipe for a child meant to outlive a crash) and a daemonic multiprocessing Process
    ``$OUT/fork_safety``  when present, its content becomes ``HVD_ELASTIC_FORK_SAFETY`` of
                 processes started from then on (the benchmark switches the fix per round)

Files under OUT:
    events.jsonl              the run decorator's event log (rank 0)
    ledger/<pid>.jsonl        one record per batch, written BEFORE its step: ``key``
                              [epoch, offset, world size, step samples], ``rank``, ``loader``,
                              ``idx`` and ``xsum`` (the batch's data, to compare runs)
    procs/<pid>.json          this process: rank and size when it entered training, whether fork
                              safety is on, its helpers' pids by kind
    children/<pid>.json       each DataLoader worker and helper when it starts: ``kind``
                              (loader_worker, fork_helper, mp_helper),
                              ``parent``, ``loader``, ``gloo`` (Gloo sockets it holds)
    final-<rank>.json         parameter checksum, samples, epochs, committed history (rank 0)

Stall: while ``$OUT/stall-<pid>`` exists, the DataLoader workers of process ``pid``
block in ``__getitem__`` (after writing ``$OUT/stalled-<their pid>``) until
``$OUT/release`` exists: workers stuck in I/O, which torch's watchdog never ends.
Every wait is bounded by ``WAIT_LIMIT`` seconds.
"""

import hashlib
import json
import multiprocessing
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset

import horovod.torch as hvd

import hvd_elastic

from testbed.worker import Indexed
from hvd_elastic.training._internal import forksafe, gloo_hangup
from hvd_elastic.training.sampler import ExactlyOnceSampler
from hvd_elastic.training.state import TrainingState

OUT = os.environ["OUT"]
LOADERS = os.environ.get("LOADERS", "w2").split(",")
EPOCHS = int(os.environ.get("EPOCHS", "1"))
SAMPLES = int(os.environ.get("SAMPLES", "64"))
BATCH = int(os.environ.get("BATCH", "4"))
STEP_SLEEP = float(os.environ.get("STEP_SLEEP", "0.02"))
LEDGER = os.environ.get("LEDGER", "1") == "1"
WAIT_LIMIT = 120.0

LOADER_CONFIGS = {
    "w0": {"num_workers": 0},
    "w2": {"num_workers": 2},
    "w2p": {"num_workers": 2, "persistent_workers": True},
    "w2pin": {"num_workers": 2, "pin_memory": True, "prefetch_factor": 4},
    "stateful2": {"num_workers": 2, "stateful": True},
    "spawn2": {"num_workers": 2, "multiprocessing_context": "spawn"},
    "forkserver2": {"num_workers": 2, "multiprocessing_context": "forkserver"},
}


def out(*parts: str) -> str:
    return os.path.join(OUT, *parts)


def write_atomic(path: str, obj) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def wait_for(path: str) -> None:
    deadline = time.monotonic() + WAIT_LIMIT
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


def report_child(kind: str, loader: str | None) -> None:
    write_atomic(out("children", f"{os.getpid()}.json"), {"kind": kind, "parent": os.getppid(), "loader": loader,
                                                         "gloo": len(gloo_hangup.gloo_sockets())})


class Stalling(Indexed):
    """The test bed's data set (each sample with its index), stalling on request (see above)."""

    def __getitem__(self, i):
        if os.path.exists(out(f"stall-{os.getppid()}")):
            write_atomic(out(f"stalled-{os.getpid()}"), {})
            wait_for(out("release"))
        return super().__getitem__(i)


class WorkerInit:
    """``worker_init_fn`` that reports the worker (a class: spawn needs it picklable)."""

    def __init__(self, loader: str):
        self.loader = loader

    def __call__(self, worker_id: int) -> None:
        report_child("loader_worker", self.loader)


def make_loader(name: str, dataset: Dataset, sampler: ExactlyOnceSampler):
    options = dict(LOADER_CONFIGS[name])
    cls = DataLoader
    if options.pop("stateful", False):
        from torchdata.stateful_dataloader import StatefulDataLoader as cls
    if options["num_workers"]:
        options["worker_init_fn"] = WorkerInit(name)
    return cls(dataset, batch_sampler=sampler, collate_fn=ExactlyOnceSampler.collate(), **options)


def helper(kind: str) -> None:
    try:
        report_child(kind, None)
        wait_for(out("release"))
    finally:
        os._exit(0)


def start_helpers() -> dict[str, int]:
    pid = os.fork()
    if pid == 0:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        helper("fork_helper")
    mp_helper = multiprocessing.get_context("fork").Process(target=helper, args=("mp_helper",), daemon=True)
    mp_helper.start()
    return {"fork_helper": pid, "mp_helper": mp_helper.pid}


def checksum(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    if os.path.exists(out("fork_safety")):
        with open(out("fork_safety")) as f:
            os.environ[forksafe.ENV] = f.read().strip()
    hvd.init()
    for folder in ("ledger", "procs", "children"):
        os.makedirs(out(folder), exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dataset = Stalling(SAMPLES, features=8)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                         named_parameters=model.named_parameters())
    sampler = ExactlyOnceSampler(dataset, BATCH, seed=7)
    state = TrainingState(model=model, optimizer=optimizer, sampler=sampler, epoch=0, history=[])
    helpers = start_helpers() if os.environ.get("FORK_HELPER") == "1" else {}
    loaders: dict[str, object] = {}
    ledger = open(out("ledger", f"{os.getpid()}.jsonl"), "a", buffering=1) if LEDGER else None
    empty = ([], torch.zeros(0, 8), torch.zeros(0))

    @hvd_elastic.run(event_log=out("events.jsonl"))
    def train(state):
        installed = forksafe.install(state.worker_settings.fork_safety)  # the first install's answer
        write_atomic(out("procs", f"{os.getpid()}.json"), {"rank": hvd.rank(), "size": hvd.size(),
                                                           "fork_safety": installed, "helpers": helpers})
        for state.epoch in range(state.epoch, len(LOADERS) * EPOCHS):
            name = LOADERS[state.epoch // EPOCHS]
            if name not in loaders:
                loaders.clear()  # the previous configuration's persistent workers end with it
                loaders[name] = make_loader(name, dataset, sampler)
            sampler.set_epoch(state.epoch)
            for batch in loaders[name]:
                key = [state.epoch, sampler.offset, hvd.size(), sampler.step_samples]
                indices, x, y = batch if batch is not None else empty
                if ledger is not None:
                    ledger.write(json.dumps({"key": key, "rank": hvd.rank(), "loader": name,
                                             "idx": [int(i) for i in indices], "xsum": float(x.sum())}) + "\n")
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y, reduction="sum") / (BATCH * hvd.size())
                loss.backward()
                optimizer.step()
                sampler.record_batch()
                if ledger is not None:
                    state.history.append(key)
                state.commit()
                if STEP_SLEEP and not os.path.exists(out("fast")):
                    time.sleep(STEP_SLEEP)

    train(state)
    write_atomic(out(f"final-{hvd.rank()}.json"), {"rank": hvd.rank(), "size": hvd.size(),
                                                   "checksum": checksum(model), "scheduler": None,
                                                   "samples": SAMPLES, "epochs": len(LOADERS) * EPOCHS,
                                                   "history": state.history if hvd.rank() == 0 else None})


if __name__ == "__main__":
    main()
