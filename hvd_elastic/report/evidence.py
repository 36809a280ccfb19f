"""The per-sample evidence a training job leaves in its run directory, for the exactly-once verdict.

Written by every rank of :mod:`hvd_elastic.demo.train` (and of the test bed's
training worker), judged by :mod:`.ledger`: the report owns the format, so its
writer and its reader change together.  Only training processes import this
module (it needs torch and Horovod); ``hvd-elastic report`` never does.  The
directory is shared by every rank (a shared file system, as on a cluster):

* ``ledger/<host>-<pid>.jsonl``: one record per batch, written BEFORE the step:
  the step's key ``[epoch, offset, world_size, step_samples]``, the rank and
  the sample indices.  The committed ``history`` user value lists the key of
  every committed step, so the verdict counts a record only if its key is in
  the final history (rolled-back steps never count; a replayed key carries the
  same indices).  The committed ``digests`` value holds, per committed step,
  the digest of parameters and optimizer state before and after it (the
  verdict checks the chain).
* ``progress.jsonl``: rank 0 appends ``{"time", "step", "size", "epoch", "host"}``
  (and what the script adds, a loss) after every commit: what the demo and the
  report read.
* ``pids/<pid>.json``: rank, size and host of each worker since its last (re)start, and
  when its process started, finished importing and finished ``hvd.init()``.
* ``final-<rank>.json``: parameter and optimizer checksums, scheduler state, the
  optimizer states' step counts and (rank 0) the history and digests, when training ends.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time

import torch

import horovod.torch as hvd

from hvd_elastic.envvars import horovod_hostname

IMPORTED = time.time()  # torch + horovod imported: where a worker's start-up ends unless told otherwise


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


def process_start() -> float:
    """Wall time at which this process started (its fork), to the clock tick.

    Not ``psutil.Process().create_time()``: that adds the boot time of
    ``/proc/stat``, in whole seconds, so it is off by up to a second (0.34 s on
    the bed), more than a forked worker's whole start-up.
    """
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime: ticks since boot
    since_start = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - since_start


class Evidence:
    """The files this worker leaves in ``out``; ``imported``: when its imports ended (default :data:`IMPORTED`)."""

    def __init__(self, out: str, imported: float | None = None):
        self.out = out
        self.imported = IMPORTED if imported is None else imported
        self.host = horovod_hostname() or socket.gethostname()
        self.initialised: float | None = None  # the caller sets it once hvd.init() returned
        for sub in ("ledger", "pids"):
            os.makedirs(os.path.join(out, sub), exist_ok=True)
        self._ledger = open(os.path.join(out, "ledger", f"{self.host}-{os.getpid()}.jsonl"), "a", buffering=1)

    def started(self) -> None:
        """At each (re)entry of the training function: who this worker is now, and its start-up times."""
        write_atomic(os.path.join(self.out, "pids", f"{os.getpid()}.json"),
                     {"rank": hvd.rank(), "size": hvd.size(), "host": self.host, "pid": os.getpid(),
                      "process_start": process_start(), "imported": self.imported,
                      "initialised": self.initialised})

    def batch(self, key: list, indices) -> None:
        self._ledger.write(json.dumps({"key": key, "rank": hvd.rank(), "idx": [int(i) for i in indices]}) + "\n")

    def tracked_batch(self, state, sampler, indices) -> list:
        """Ledger record, committed-``history`` entry and digest before the step of the batch about to
        train; its step key.

        Call before the step: a step that is rolled back leaves its record, and its key
        leaves ``history`` with the restore, which is the rule the verdict applies.
        """
        key = [state.epoch, sampler.offset, hvd.size(), sampler.step_samples]
        self.batch(key, indices)
        state.history.append(key)
        state.digests.append([checksum(state.model, state.optimizer), None])
        return key

    def applied(self, state) -> None:
        """After ``optimizer.step()``: the step's digest after."""
        state.digests[-1][1] = checksum(state.model, state.optimizer)

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
        """Sleep ``seconds`` unless ``out/fast`` or ``out/stop`` exists: events land mid-run, the rest runs at speed."""
        if seconds and not (self.flag("fast") or self.flag("stop")):
            time.sleep(seconds)


def write_final(out: str, model, optimizer, scheduler, state, samples: int) -> None:
    """``final-<rank>.json``, what :func:`hvd_elastic.report.ledger.verdict` reads: checksums, scheduler,
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
