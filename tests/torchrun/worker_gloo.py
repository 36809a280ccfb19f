"""A torchrun worker for the Consul rendezvous tests: Gloo all-reduces until any rank sees ``$OUT/stop``.

Every step appends ``{pid, addr, rank, size, restart, time}`` to ``$OUT/rows.<pid>.jsonl`` (``addr``: its
agent's ``--local-addr``, from ``$AGENT_ADDR``), and checks that every rank summed the same vector.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    out = Path(os.environ["OUT"])
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    rows = out / f"rows.{os.getpid()}.jsonl"
    while True:
        total = torch.ones(4) * (rank + 1)
        dist.all_reduce(total)
        assert torch.equal(total, torch.full((4,), size * (size + 1) / 2))
        stop = torch.tensor([1.0 if (out / "stop").exists() else 0.0])
        dist.all_reduce(stop)
        row = {"pid": os.getpid(), "addr": os.environ["AGENT_ADDR"], "rank": rank, "size": size,
               "restart": int(os.environ["TORCHELASTIC_RESTART_COUNT"]), "time": time.time()}
        with rows.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if stop.item() > 0:
            break
        time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
