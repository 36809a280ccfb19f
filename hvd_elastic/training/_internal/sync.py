"""The two rounds of :meth:`TrainingState.sync`: each rank gets only what it lacks of rank 0's commit.

Every rank has learnt from one collective which ranks share rank 0's lineage
(its ``sharers``); :func:`move` then works on the commit buffers alone:

* round one, from the lineages: everything to the ranks outside rank 0's
  lineage, from rank 0 and the ranks of its lineage;
* round two, from the digests, whenever a rank besides 0 is trusted by its
  lineage: the ranks of the lineage hash their buffers while round one is on
  the wire (its receivers hash what they are sent), and whatever the digests
  show differs moves after.

So nothing moves after a failure all survivors restored from, and after a
join only the joiner's share.  How units travel is :mod:`.transfer`'s.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Callable, Collection, Sequence

import torch

from hvd_elastic.training._internal import comm, transfer
from hvd_elastic.training._internal.flat import FlatBuffer


@dataclass(frozen=True)
class Moved:
    """What one sync moved, for the ``sync`` event."""

    plan: transfer.Plan  # which ranks needed which tensors, both rounds together
    proof: str  # what showed it: "lineages" (round one alone) or "digests"
    method: str  # how the units travelled (transfer.methods)
    sent: int  # bytes this rank sent
    received: int  # bytes it received
    wire_seconds: float  # both rounds, with the copies and the hashing they overlap


def move(buffer: FlatBuffer, *, sharers: Collection[int], hashing: bool, copying: bool,
         live: Sequence[torch.Tensor], unpack: Callable[[list[int]], None], bucket_bytes: int) -> Moved:
    """Collective: make every rank's ``buffer`` hold rank 0's, moving only what ranks lack.

    ``sharers``: the ranks besides 0 of rank 0's lineage.  ``hashing``: this
    rank's buffer holds its lineage's tensors (it hashes them while round one
    is on the wire).  ``copying`` (rank 0): its ``live`` tensors must be copied
    into the buffer first.  ``unpack(indices)`` is called as a receiver's
    tensors arrive, while the next unit is on the wire.
    """
    collectives = comm.required()
    rank, size, count = collectives.rank(), collectives.size(), len(buffer.layout)
    first = transfer.Plan.lacking(size, count, (r for r in range(1, size) if r not in sharers))
    verify = bool(sharers)
    todo = transfer.units(buffer, first, bucket_bytes)
    # Rank 0 copies its live tensors as it sends them, unless its digests must be of the
    # copy (or it sends nothing): then it copies them all first.
    fill_as_sent = copying and not verify and bool(todo)
    if copying and not fill_as_sent:
        buffer.copy_from(live)
    table = transfer.empty_table(count)
    meanwhile: list[Callable[[], None]] = [functools.partial(transfer.hash_into, table, buffer, [i])
                 for i in range(count if verify and hashing else 0)]

    def unpack_and_hash(indices: list[int]) -> None:
        unpack(indices)
        transfer.hash_into(table, buffer, indices)

    start = time.perf_counter()
    sent, received = transfer.transfer(
        todo, rank=rank, name="hvd_elastic.sync.bucket",
        fill=functools.partial(_fill, buffer, live) if fill_as_sent else None,
        unpack=unpack_and_hash if verify else unpack, window_bytes=2 * bucket_bytes, meanwhile=meanwhile)
    chosen, proof = first, "lineages"
    if verify:
        for work in meanwhile:  # what the transfer did not hide
            work()
        second = transfer.plan(collectives.allgather_rows(table, name="hvd_elastic.sync.digests"))
        fixes = transfer.units(buffer, second, bucket_bytes)
        more_sent, more_received = transfer.transfer(fixes, rank=rank, name="hvd_elastic.sync.fix",
                                                     unpack=unpack, window_bytes=2 * bucket_bytes)
        todo, sent, received = todo + fixes, sent + more_sent, received + more_received
        chosen, proof = first | second, "digests"
    return Moved(chosen, proof, transfer.methods(todo), sent, received, time.perf_counter() - start)


def _fill(buffer: FlatBuffer, live: Sequence[torch.Tensor], indices: list[int]) -> None:
    buffer.copy_indices(indices, live)
