"""Small Python objects between the ranks of a world, one collective each.

Horovod's ``broadcast_object`` and ``allgather_object`` take two collectives
each: the sizes first, then the bytes.  In a world that has just formed, every
collective is a full negotiation through rank 0 (nothing is in Horovod's
response cache yet), 10-20 ms on a loaded host, and the start of every world
(after each join, failure or drain) runs several of them before training goes
on.  Here each is ONE allgather of bytes (:meth:`.comm.Comm.allgather_bytes`: one
collective under Horovod, two under torch.distributed), which accepts a different
length from every rank and concatenates in rank order:

* :func:`broadcast_object`: the root contributes its pickled object, every
  other rank nothing;
* :func:`allgather_object`: every rank contributes an 8-byte length followed by
  its pickle, and the concatenation is split by those lengths.

Contracts: collective (every rank of the world calls it with the same
``name``); objects are pickled with ``cloudpickle``, as Horovod's own object
collectives do (a state's user values may hold a lambda), and only ever
unpickled from the job's own ranks (the world's Gloo peers); the root's
:func:`broadcast_object` returns the object it passed, the others a copy.
Gloo's allgather is a ring, so the root's bytes cross N-1 links one after
another: meant for the small headers of a world's start (kilobytes), not for
tensors' contents.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

import cloudpickle
import torch

from hvd_elastic.training._internal import comm

_LENGTH = struct.Struct("<Q")


def _as_tensor(data: bytes) -> torch.Tensor:
    if not data:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def broadcast_object(obj: Any, root_rank: int = 0, *, name: str) -> Any:
    """``obj`` from ``root_rank`` on every rank (the argument is ignored elsewhere)."""
    world = comm.required()
    mine = cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if world.rank() == root_rank else b""
    gathered = world.allgather_bytes(_as_tensor(mine), name=name)
    if world.rank() == root_rank:
        return obj
    return pickle.loads(gathered.numpy().tobytes())


def allgather_object(obj: Any, *, name: str) -> list[Any]:
    """Every rank's ``obj``, in rank order."""
    world = comm.required()
    data = cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    mine = _as_tensor(_LENGTH.pack(len(data)) + data)
    gathered = memoryview(world.allgather_bytes(mine, name=name).numpy().tobytes())
    objects, at = [], 0
    while at < len(gathered):
        (length,) = _LENGTH.unpack_from(gathered, at)
        at += _LENGTH.size
        objects.append(pickle.loads(gathered[at:at + length]))
        at += length
    if len(objects) != world.size():
        raise RuntimeError(f"allgather_object {name!r}: {len(objects)} objects from a world of {world.size()}")
    return objects
