"""Elastic job worker: records the world size at every committed step.

Each step appends ``{"rank", "size", "step", "time"}`` to ``$SMOKE_DIR/sizes.<pid>.jsonl``
(the rows :class:`testbed.WorldSizes` reads).
Rank 0 ends the job once ``$SMOKE_DIR/stop`` exists; the decision is shared by
an allreduce so every rank leaves the loop on the same step.
"""

import json
import os
import time

import torch

import horovod.torch as hvd

SMOKE_DIR = os.environ["SMOKE_DIR"]


def stop_requested() -> bool:
    flag = float(hvd.rank() == 0 and os.path.exists(os.path.join(SMOKE_DIR, "stop")))
    return hvd.allreduce(torch.tensor([flag]), op=hvd.Max, name="stop").item() > 0


def main() -> None:
    hvd.init()
    state = hvd.elastic.TorchState(step=0)
    log_path = os.path.join(SMOKE_DIR, f"sizes.{os.getpid()}.jsonl")

    @hvd.elastic.run
    def train(state):
        while not stop_requested():
            hvd.allreduce(torch.ones(1), name="work")
            state.step += 1
            with open(log_path, "a") as log:
                log.write(json.dumps({"rank": hvd.rank(), "size": hvd.size(), "step": state.step,
                                      "time": time.time()}) + "\n")
            state.commit()
            time.sleep(0.1)

    train(state)


if __name__ == "__main__":
    main()
