"""Elastic Horovod worker for the end-to-end tests: records every world size it trains at.

Each step allreduces a scalar (so every rank of the current world takes part),
commits, and appends {pid, host, rank, size, step, event} to
$SIZES_DIR/sizes.<pid>.jsonl.  Events: "step", "reset" (a reset callback
ran) and "restore" (a rollback to the last commit after a failure).  All
ranks stop together once $SIZES_DIR/stop exists.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable

import horovod.torch as hvd
import torch

SIZES_DIR = os.environ["SIZES_DIR"]
STEP_SLEEP = float(os.environ.get("STEP_SLEEP", "0.1"))
HOST = os.environ.get("HOROVOD_HOSTNAME", socket.gethostname())
# One O_APPEND write per row: a reader never sees half a row followed by another.
LOG_FD = os.open(os.path.join(SIZES_DIR, f"sizes.{os.getpid()}.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def record(event: str, step: int) -> None:
    row = {"pid": os.getpid(), "host": HOST, "rank": hvd.rank(), "size": hvd.size(), "step": step, "event": event,
           "time": time.time()}
    os.write(LOG_FD, (json.dumps(row) + "\n").encode())


class RecordingState(hvd.elastic.TorchState):
    def restore(self):
        record("restore", self.step)
        super().restore()


def train_until_stopped(state, commit: Callable[[], None]) -> None:
    """Step (allreduce, record, sleep, ``commit()``) until ``$SIZES_DIR/stop`` exists; all ranks stop together."""
    while True:
        flags = torch.tensor([1.0, float(os.path.exists(os.path.join(SIZES_DIR, "stop")))])
        total = hvd.allreduce(flags, op=hvd.Sum, name="flags")
        assert int(total[0]) == hvd.size()
        record("step", state.step)
        if total[1] > 0:
            return
        time.sleep(STEP_SLEEP)
        commit()


def main() -> None:
    hvd.init()
    state = RecordingState(step=0)
    state.register_reset_callbacks([lambda: record("reset", state.step)])

    def commit() -> None:
        state.step += 1
        state.commit()

    hvd.elastic.run(train_until_stopped)(state, commit)


if __name__ == "__main__":
    main()
