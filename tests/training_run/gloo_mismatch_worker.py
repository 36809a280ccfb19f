"""Two ranks under an elastic horovodrun and :func:`hvd_elastic.run`: a failure that loses no peer.

The first entry's allreduce has a different shape on each rank.  Horovod
fails it on every rank with ``HorovodInternalError`` although every peer is
alive and the background loop still runs: the elastic loop hangs up the Gloo
connections of a context that is not dead, resets, and the next entry's
allreduce must work in a world of the same size.  Each rank writes
``$OUT/rank<N>.json``: its entries (world size, time), how many Gloo
connections each hang-up shut down, the error the first entry saw and the
second entry's allreduce result.
"""

import json
import os
import time

import torch

import horovod.torch as hvd
import hvd_elastic
from hvd_elastic.training._internal import gloo_hangup
from hvd_elastic.training.state import TrainingState

OUT = os.environ["OUT"]
hvd.init()
report = {"entries": [], "hung_up": [], "error": None, "result": None}
real_hang_up = gloo_hangup.hang_up


def counting_hang_up():
    fds = real_hang_up()
    report["hung_up"].append(len(fds))
    return fds


gloo_hangup.hang_up = counting_hang_up  # elastic_loop calls it through the module


@hvd_elastic.run
def train(state):
    report["entries"].append({"size": hvd.size(), "at": time.time()})
    if len(report["entries"]) == 1:
        try:
            hvd.allreduce(torch.ones(hvd.rank() + 1), name="mismatched")
        except Exception as exc:
            report["error"] = f"{type(exc).__name__}: {exc}"
            report["failed_at"] = time.time()
            raise
    report["result"] = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum, name="after").item()
    state.step += 1
    state.commit()


train(TrainingState(step=0))
with open(os.path.join(OUT, f"rank{hvd.rank()}.json"), "w") as f:
    json.dump(report, f)
