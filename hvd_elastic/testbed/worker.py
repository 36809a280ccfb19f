"""The training job the fault matrix, the recovery benchmark and the multi-host bed run.

``python -m hvd_elastic.testbed.worker --out DIR [--api hvd_elastic|horovod]``, one
process per slot under elastic horovodrun.  It trains an MLP on a deterministic
regression data set, committing after every step, and leaves evidence in ``DIR``
(a shared file system, as on a cluster):

* ``ledger/<host>-<pid>.jsonl``: one record per batch, written BEFORE the step:
  the step's key ``[epoch, offset, world_size, step_samples]``, the rank and
  the sample indices.  With ``--api hvd_elastic`` the committed ``history``
  user value lists the key of every committed step, so :mod:`.ledger` counts a
  record only if its key is in the final history (rolled-back steps never count;
  a replayed key carries the same indices).  The committed ``digests`` value
  holds, per committed step, the digest of parameters and optimizer state
  before and after it (:mod:`.ledger` checks the chain).
* ``progress.jsonl``: rank 0 appends ``{"time", "step", "size", "epoch", "host"}``
  after every commit: what tests wait on and benchmarks time.
* ``pids/<pid>.json``: rank, size and host of each worker since its last (re)start, and
  when its process started, finished importing and finished ``hvd.init()``.
* ``final-<rank>.json``: parameter and optimizer checksums, scheduler state, the
  optimizer states' step counts and (rank 0) the history and digests, when training ends.
* ``events.jsonl`` and ``ckpt/``: the run decorator's event log and checkpoints
  (``--api hvd_elastic`` only; ``--checkpoint-dir`` puts the checkpoints elsewhere,
  such as a directory each host sees differently).

While ``DIR/stall-checkpoints`` exists, checkpoint writes stall before they
become durable, so a test can kill the job in the middle of one.

While ``DIR/hold-epoch-<E>`` exists, every rank stops after the last commit of
epoch ``E`` (the epoch complete, not yet advanced), writes
``DIR/held-epoch-<E>-<rank>`` with its step, and waits; then the epoch ends with
an allreduce (a validation metric, as real scripts have), so a fault injected
during the hold lands exactly on an epoch's last commit.

Training goes on epoch after epoch until ``DIR/stop`` exists at an epoch's end
(the decision is an allreduce, so every rank stops at the same epoch), or
``--epochs`` is reached.  Each step sleeps ``--step-sleep`` seconds until ``DIR/fast``
or ``DIR/stop`` exists, so faults land mid-run.

Every step ends, between ``optimizer.step()`` and ``state.commit()``, with an
allreduce of its loss (as real scripts log it).  When ``DIR/die-after-step``
exists (``RANK STEP``, default ``1 5``), that rank claims it at that step or
later and SIGKILLs itself there, after its own optimizer step: its peers' update
is applied, and they fail inside that collective, the window where a restore
must roll the update back.
``--broken-restore`` (tests only) is a deliberately broken ``restore()`` that
rolls back sampler and values but not model, optimizer and scheduler, for the
proof that :mod:`.ledger` catches a step applied twice.

``--api horovod`` is stock Horovod elastic (``hvd.elastic.TorchState`` with an
``ElasticSampler``), the baseline of the recovery benchmark; it writes progress
and pids but no ledger check applies (its sampler does not promise exactly-once).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib
import json
import os
import signal
import socket
import time

import psutil
import torch
from torch.utils.data import DataLoader, Dataset

import horovod.torch as hvd

IMPORTED = time.time()  # torch + horovod imported; main() moves it past --import: a joining worker's start-up ends there


class Indexed(Dataset):
    """Deterministic regression data that also returns each sample's index."""

    def __init__(self, n: int, features: int = 16):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, features, generator=g)
        self.y = self.x @ torch.randn(features, generator=g) + 0.01 * torch.randn(n, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return i, self.x[i], self.y[i]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="shared output folder")
    parser.add_argument("--api", choices=("hvd_elastic", "horovod"), default="hvd_elastic")
    parser.add_argument("--samples", type=int, default=480)
    parser.add_argument("--batch", type=int, default=4, help="samples per rank per step")
    parser.add_argument("--epochs", type=int, default=1000, help="upper bound; DIR/stop ends training sooner")
    parser.add_argument("--step-sleep", type=float, default=0.1)
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="commits between checkpoints")
    parser.add_argument("--checkpoint-dir", help="where checkpoints go (default: OUT/ckpt)")
    parser.add_argument("--import", dest="imports", default="", metavar="MOD[,MOD...]",
                        help="modules to import before hvd.init(), as a real script's heavy imports "
                             "(the start-up a joining worker costs)")
    parser.add_argument("--broken-restore", action="store_true",
                        help="tests only: restore() leaves model, optimizer and scheduler as they are")
    return parser.parse_args(argv)


def checksum(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in sorted(optimizer.state[p].items()):
                if torch.is_tensor(value):
                    h.update(key.encode())
                    h.update(value.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def write_atomic(path: str, obj: object) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


class Evidence:
    """The files this worker leaves in ``--out``."""

    def __init__(self, out: str):
        self.out = out
        self.host = os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()
        for sub in ("ledger", "pids"):
            os.makedirs(os.path.join(out, sub), exist_ok=True)
        self._ledger = open(os.path.join(out, "ledger", f"{self.host}-{os.getpid()}.jsonl"), "a", buffering=1)

    def started(self) -> None:
        """At each (re)entry of the training function: who this worker is now, and its start-up times."""
        write_atomic(os.path.join(self.out, "pids", f"{os.getpid()}.json"),
                     {"rank": hvd.rank(), "size": hvd.size(), "host": self.host, "pid": os.getpid(),
                      "process_start": psutil.Process().create_time(), "imported": IMPORTED, "initialised": self.initialised})

    def batch(self, key: list, indices) -> None:
        self._ledger.write(json.dumps({"key": key, "rank": hvd.rank(), "idx": [int(i) for i in indices]}) + "\n")

    def tracked_batch(self, state, sampler, indices) -> list:
        """Ledger record, committed-``history`` entry and digest before the step of the batch about to
        train; its step key.

        Call before the step: a step that is rolled back leaves its record, and its key
        leaves ``history`` with the restore, which is the rule :mod:`.ledger` applies.
        """
        key = [state.epoch, sampler.offset, hvd.size(), sampler.step_samples]
        self.batch(key, indices)
        state.history.append(key)
        state.digests.append([checksum(state.model, state.optimizer), None])
        return key

    def applied(self, state) -> None:
        """After ``optimizer.step()``: the step's digest after; then, when asked, this rank dies here."""
        state.digests[-1][1] = checksum(state.model, state.optimizer)
        claim = os.path.join(self.out, "die-after-step")
        try:  # no exists() first: the rank that claims it may unlink it between the two
            with open(claim) as f:
                rank, step = (int(v) for v in (f.read().split() or ["1", "5"]))
        except FileNotFoundError:
            return
        if hvd.rank() == rank and state.step + 1 >= step:
            try:
                os.unlink(claim)  # one process wins the claim: the fault happens once
            except FileNotFoundError:
                return
            time.sleep(1.0)  # the peers' updates are applied and they wait in the next collective
            os.kill(os.getpid(), signal.SIGKILL)

    def committed(self, step: int, epoch: int, **fields) -> None:
        """Rank 0's progress row for a committed step; ``fields`` (a loss) are added to it."""
        if hvd.rank() == 0:
            line = json.dumps({"time": time.time(), "step": step, "size": hvd.size(), "epoch": epoch,
                               "host": self.host, **fields})
            # O_APPEND writes of one short line are atomic, whichever process is rank 0 now.
            with open(os.path.join(self.out, "progress.jsonl"), "a") as f:
                f.write(line + "\n")

    def flag(self, name: str) -> bool:
        return os.path.exists(os.path.join(self.out, name))

    def pause(self, seconds: float) -> None:
        if seconds and not (self.flag("fast") or self.flag("stop")):
            time.sleep(seconds)

    def hold(self, name: str, step: int, limit: float = 300.0) -> None:
        """While ``DIR/hold-<name>`` exists: write ``DIR/held-<name>-<rank>`` (holding ``step``), then wait.

        Bounded by ``limit`` seconds, so a test that never releases it cannot hang the job.
        """
        if not self.flag(f"hold-{name}"):
            return
        write_atomic(os.path.join(self.out, f"held-{name}-{hvd.rank()}"), {"step": step, "pid": os.getpid()})
        deadline = time.monotonic() + limit
        while self.flag(f"hold-{name}") and time.monotonic() < deadline:
            time.sleep(0.05)

    def epoch_metric(self, value: float) -> float:
        """The epoch's mean of ``value`` over the ranks: the collective a validation pass ends with."""
        return hvd.allreduce(torch.tensor([value]), name="epoch_metric").item()

    def stop_requested(self) -> bool:
        flag = float(hvd.rank() == 0 and self.flag("stop"))
        return hvd.allreduce(torch.tensor([flag]), op=hvd.Max, name="stop").item() > 0


def step_loss(loss: torch.Tensor) -> float:
    """The step's loss over the world: the collective real scripts run between ``optimizer.step()`` and
    ``commit()`` to log it."""
    return hvd.allreduce(loss.detach(), op=hvd.Sum, name="loss").item()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    global IMPORTED
    for module in filter(None, args.imports.split(",")):
        importlib.import_module(module)
    IMPORTED = time.time()
    hvd.init()  # a joining worker's rendezvous with the survivors happens in here
    torch.set_num_threads(1)
    evidence = Evidence(args.out)
    evidence.initialised = time.time()
    torch.manual_seed(1000 + os.getpid())  # different on every worker: the state's sync must fix it
    dataset = Indexed(args.samples)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.9)
    if args.api == "horovod":
        train, state, sampler = _horovod_job(args, dataset, model, optimizer, scheduler, evidence)
    else:
        train, state, sampler = _hvd_elastic_job(args, dataset, model, optimizer, scheduler, evidence)
    train(state)
    write_final(args.out, model, optimizer, scheduler, state, args.samples)


def write_final(out: str, model, optimizer, scheduler, state, samples: int) -> None:
    """``final-<rank>.json``, what :func:`hvd_elastic.testbed.ledger.verdict` reads: checksums, scheduler,
    the optimizer states' step counts, (rank 0) the committed ``history`` of step keys and their
    ``digests``, the epochs trained and the data set's size."""
    rank0 = hvd.rank() == 0
    write_atomic(os.path.join(out, f"final-{hvd.rank()}.json"), {
        "rank": hvd.rank(), "size": hvd.size(), "checksum": checksum(model, optimizer),
        "scheduler": scheduler.state_dict(), "lr": optimizer.param_groups[0]["lr"],
        "optimizer_steps": [int(entry["step"]) for entry in optimizer.state.values() if "step" in entry],
        "history": getattr(state, "history", None) if rank0 else None,
        "digests": getattr(state, "digests", None) if rank0 else None,
        "epochs": state.epoch, "samples": samples,
    })


def _step(model, optimizer, scheduler, x, y, step_samples: int) -> torch.Tensor:
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y, reduction="sum") / step_samples
    loss.backward()
    optimizer.step()
    scheduler.step()
    return loss


class _BrokenRestore:
    """Tests only: a restore() that rolls back sampler and values but keeps model, optimizer and
    scheduler as they are (a regression :mod:`.ledger` must catch)."""

    def restore(self) -> None:
        live = [(obj, copy.deepcopy(obj.state_dict())) for obj in (self.model, self.optimizer, *self.schedulers)]
        super().restore()
        for obj, kept in live:
            obj.load_state_dict(kept)


def _hvd_elastic_job(args, dataset, model, optimizer, scheduler, evidence):
    import hvd_elastic
    from hvd_elastic import ExactlyOnceSampler, TrainingState
    from hvd_elastic.training.checkpoint import WRITE_DELAY_ENV

    sampler = ExactlyOnceSampler(dataset, args.batch, seed=7)
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=args.num_workers,
                        collate_fn=ExactlyOnceSampler.collate())
    cls = type("BrokenRestoreState", (_BrokenRestore, TrainingState), {}) if args.broken_restore else TrainingState
    state = cls(model=model, optimizer=optimizer, schedulers=[scheduler], sampler=sampler,
                epoch=0, step=0, history=[], digests=[])
    empty = ([], torch.zeros(0, 16), torch.zeros(0))

    @hvd_elastic.run(checkpoint_dir=args.checkpoint_dir or os.path.join(args.out, "ckpt"),
                     checkpoint_every_commits=args.checkpoint_every,
                     event_log=os.path.join(args.out, "events.jsonl"))
    def train(state):
        evidence.started()
        while state.epoch < args.epochs:
            sampler.set_epoch(state.epoch)
            for batch in loader:
                indices, x, y = batch if batch is not None else empty
                evidence.tracked_batch(state, sampler, indices)
                loss = _step(model, optimizer, scheduler, x, y, sampler.samples_this_step)
                evidence.applied(state)
                step_loss(loss)
                sampler.record_batch()
                state.step += 1
                # While DIR/stall-checkpoints exists, writes stall (read by the writer at each write).
                os.environ[WRITE_DELAY_ENV] = "120" if evidence.flag("stall-checkpoints") else "0"
                state.commit()
                evidence.committed(state.step, state.epoch)
                evidence.pause(args.step_sleep)
            evidence.hold(f"epoch-{state.epoch}", state.step)
            evidence.epoch_metric(float(state.step))
            state.epoch += 1
            state.commit()
            if evidence.stop_requested():
                return

    return train, state, sampler


def _horovod_job(args, dataset, model, optimizer, scheduler, evidence):
    from horovod.torch.elastic import ElasticSampler

    sampler = ElasticSampler(dataset, shuffle=True, seed=7)
    loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler, num_workers=args.num_workers)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0, step=0, batch=0)

    @hvd.elastic.run
    def train(state):
        evidence.started()
        while state.epoch < args.epochs:
            sampler.set_epoch(state.epoch)
            # As Horovod's elastic examples do: the index within this pass over the loader.
            for i, (indices, x, y) in enumerate(loader):
                evidence.batch([state.epoch, state.batch, hvd.size(), args.batch], indices)
                _step(model, optimizer, scheduler, x, y, args.batch * hvd.size())
                sampler.record_batch(i, args.batch)
                state.batch += 1
                state.step += 1
                state.commit()
                evidence.committed(state.step, state.epoch)
                evidence.pause(args.step_sleep)
            state.epoch += 1
            state.batch = 0
            state.commit()
            if evidence.stop_requested():
                return

    return train, state, sampler


if __name__ == "__main__":
    main()
