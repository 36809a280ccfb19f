"""The training job the fault matrix, the recovery benchmark and the multi-host bed run.

``python -m testbed.worker --out DIR [--api hvd_elastic|horovod]``, one
process per slot under elastic horovodrun.  It trains an MLP on a deterministic
regression data set, committing after every step, and leaves the evidence of
:mod:`hvd_elastic.report.evidence` in ``DIR`` (``ledger/``, ``progress.jsonl``,
``pids/``, ``final-<rank>.json``; with ``--api hvd_elastic`` the committed
``history`` and ``digests`` the verdict, :mod:`hvd_elastic.report.ledger`, checks)
and, with ``--api hvd_elastic``, the run decorator's ``events.jsonl`` and ``ckpt/``
(``--checkpoint-dir`` puts the checkpoints elsewhere, such as a directory each
host sees differently).

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
proof that the verdict catches a step applied twice.

``--api horovod`` is stock Horovod elastic (``hvd.elastic.TorchState`` with an
``ElasticSampler``), the baseline of the recovery benchmark; it writes progress
and pids but no ledger check applies (its sampler does not promise exactly-once).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import os
import signal
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import horovod.torch as hvd

from hvd_elastic.report.evidence import Evidence, write_atomic, write_final


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
    parser.add_argument("--sample-cpu", type=float, default=0.0, help="CPU seconds of busy work per sample")
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="commits between checkpoints")
    parser.add_argument("--checkpoint-dir", help="where checkpoints go (default: OUT/ckpt)")
    parser.add_argument("--import", dest="imports", default="", metavar="MOD[,MOD...]",
                        help="modules to import before hvd.init(), as a real script's heavy imports "
                             "(the start-up a joining worker costs)")
    parser.add_argument("--fail-on-host", metavar="HOST",
                        help="tests only: a worker started on HOST (HOROVOD_HOSTNAME) exits 3 before hvd.init(): "
                             "a host lost between its start and its rendezvous")
    parser.add_argument("--hang-before-init-on", metavar="HOST",
                        help="tests only: the first worker started on HOST creates OUT/hung-HOST and sleeps before "
                             "hvd.init() (at most 600 s): to the driver, a worker stuck inside its world's rendezvous")
    parser.add_argument("--die-in-first-sync", metavar="FILE",
                        help="tests only: unless FILE exists, rank 0 creates it and exits 3 inside its sync (after "
                             "the resume, before the broadcast): a rank 0 lost during a relaunched job's first sync")
    parser.add_argument("--broken-restore", action="store_true",
                        help="tests only: restore() leaves model, optimizer and scheduler as they are")
    return parser.parse_args(argv)


class FaultyEvidence(Evidence):
    """The evidence, plus the switches in ``DIR`` the tests inject faults and hold points through."""

    def applied(self, state) -> None:
        """After ``optimizer.step()``: the step's digest after; then, when asked, this rank dies here."""
        super().applied(state)
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


def hang_once(marker: str, limit: float = 600.0) -> None:
    """Unless ``marker`` exists: create it, then sleep ``limit`` s and exit 4 (a test ends the process first)."""
    try:
        open(marker, "x").close()
    except FileExistsError:
        return
    time.sleep(limit)
    sys.exit(4)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    for module in filter(None, args.imports.split(",")):
        importlib.import_module(module)
    if args.api == "hvd_elastic":  # a script imports the API at its top, before hvd.init() (examples/)
        importlib.import_module("hvd_elastic.training.runner")
    imported = time.time()  # after --import: a joining worker's start-up ends here
    if args.fail_on_host and args.fail_on_host == os.environ.get("HOROVOD_HOSTNAME"):
        sys.exit(3)
    if args.hang_before_init_on and args.hang_before_init_on == os.environ.get("HOROVOD_HOSTNAME"):
        hang_once(os.path.join(args.out, f"hung-{args.hang_before_init_on}"))
    hvd.init()  # a joining worker's rendezvous with the survivors happens in here
    torch.set_num_threads(1)
    evidence = FaultyEvidence(args.out, imported=imported)
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


def _step(model, optimizer, scheduler, x, y, step_samples: int, cpu: float = 0.0) -> torch.Tensor:
    optimizer.zero_grad()
    _burn(cpu)  # before backward(): its hooks start the gradient allreduce, which must wait for this rank's work
    loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y, reduction="sum") / step_samples
    loss.backward()
    optimizer.step()
    scheduler.step()
    return loss


def _burn(seconds: float) -> None:
    """Keep this thread busy until it has used ``seconds`` of CPU time (wall time grows under a CPU quota)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class _BrokenRestore:
    """Tests only: a restore() that rolls back sampler and values but keeps model, optimizer and
    scheduler as they are (a regression the verdict must catch)."""

    def restore(self) -> None:
        live = [(obj, copy.deepcopy(obj.state_dict())) for obj in (self.model, self.optimizer, *self.schedulers)]
        super().restore()
        for obj, kept in live:
            obj.load_state_dict(kept)


class _DieInFirstSync:
    """Tests only: rank 0 exits 3 inside the sync, once per ``marker`` file."""

    marker: str

    def sync(self) -> None:
        if hvd.rank() == 0 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(3)
        super().sync()


def _hvd_elastic_job(args, dataset, model, optimizer, scheduler, evidence):
    import hvd_elastic
    from hvd_elastic import ExactlyOnceSampler, TrainingState
    from hvd_elastic.training.checkpoint import WRITE_DELAY_ENV

    sampler = ExactlyOnceSampler(dataset, args.batch, seed=7)
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=args.num_workers,
                        collate_fn=ExactlyOnceSampler.collate())
    cls = type("BrokenRestoreState", (_BrokenRestore, TrainingState), {}) if args.broken_restore else TrainingState
    if args.die_in_first_sync:
        cls = type("DyingState", (_DieInFirstSync, cls), {"marker": args.die_in_first_sync})
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
                loss = _step(model, optimizer, scheduler, x, y, sampler.samples_this_step, args.sample_cpu * len(x))
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
                _step(model, optimizer, scheduler, x, y, args.batch * hvd.size(), args.sample_cpu * len(x))
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
