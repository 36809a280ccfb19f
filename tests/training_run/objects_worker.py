"""Three Gloo ranks exchange objects through hvd_elastic's one-collective object exchange; each rank
writes what it received to ``OUT/rank<R>.json`` (repr strings, so any object compares)."""

from __future__ import annotations

import json
import sys

import horovod.torch as hvd

from hvd_elastic.training._internal import objects


def main(out: str) -> None:
    hvd.init()
    rank = hvd.rank()
    seen = {}
    seen["from 0"] = objects.broadcast_object({"rank": rank, "nan": float("nan"), "text": "h\u00f6st"} if rank == 0
                                              else "ignored", 0, name="t.from0")
    seen["from 2"] = objects.broadcast_object(("two", rank) if rank == 2 else None, 2, name="t.from2")
    seen["none"] = objects.broadcast_object(None, 0, name="t.none")
    seen["lambda"] = objects.broadcast_object((lambda: "made on rank 0") if rank == 0 else None, 0, name="t.fn")()
    big = bytes(range(256)) * 1024  # 256 KiB: bigger than any one socket write
    seen["big"] = objects.broadcast_object(big if rank == 0 else b"", 0, name="t.big") == big
    seen["gather"] = objects.allgather_object("x" * (rank * 3), name="t.gather")  # rank 0 sends an empty string
    seen["gather none"] = objects.allgather_object(None if rank == 1 else rank, name="t.gather_none")
    # The same names again and again, with sizes that change: Horovod's response cache path.
    seen["repeated"] = [objects.broadcast_object(list(range(i)) if rank == 0 else None, 0, name="t.repeat")
                        for i in (0, 5, 5, 500, 1)]
    seen["repeated gather"] = [objects.allgather_object(rank * i, name="t.repeat_gather") for i in (1, 1, 10**9)]
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({k: repr(v) for k, v in seen.items()}, f)


if __name__ == "__main__":
    main(sys.argv[1])
