"""Who needs the committed tensors after a reset, and how they get them.

After a reset every rank must hold rank 0's committed state bitwise.  Most
ranks usually do already: after a join, every survivor holds the state it
committed in lockstep with rank 0; after a failure, every survivor restored
it.  So a sync finds out who is missing what, in two rounds.

Lineages first.  A rank whose lineage (:func:`new_lineage`: where its
committed tensors come from, and how many saves since) is not rank 0's
surely lacks them: a joiner, a rank that loaded a snapshot.  It is sent
everything at once (:meth:`Plan.lacking`) by rank 0 and the ranks of its
lineage.  With no rank of rank 0's lineage besides itself, that is all:
rank 0 is the one donor, and nobody hashes.

Digests next, since a lineage is never trusted alone.  While the first
round's bytes are on the wire, every rank of rank 0's lineage hashes its
commit buffer and every receiver hashes what has arrived (:func:`hash_into`,
xxh3-128 at memory bandwidth), so the hashing hides behind the transfer.
One small allgather then shows everyone every rank's digests (:func:`plan`).
A rank whose digest of a tensor equals rank 0's holds that tensor exactly;
the others need it and get it in the second round, from ranks whose digests
match: a survivor a failure left one commit behind or whose BatchNorm
statistics drifted from rank 0's, and a receiver a drifted survivor sent a
wrong stripe in the first round.

Each round moves only what is needed (:func:`units`, :func:`transfer`), in
units: runs of neighbouring tensors of the buffer that the same ranks need,
cut at about the bucket size.  Every rank outside a unit's receivers is a
*donor* of it (it holds the unit, or in the first round its lineage says it
does):

* nobody needs anything: no transfer at all;
* rank 0 is the only donor (everyone else needs the unit): with one
  receiver, Gloo's broadcast, straight into its buffer (one send); with more,
  a relay (:func:`_relay`): rank 0 sends each receiver one stripe of a
  piece, and the receivers pass their stripes to each other while the next
  piece's arrive, so rank 0's outbound link carries S once and no tree's
  depth adds up (on the bed, Gloo moves that exchange, every receiver's
  link loaded both ways, at about half the rate plain TCP sockets reach:
  ``benchmarks/state_transfer.py``);
* otherwise every donor sends a disjoint stripe of the unit to each
  receiver, all at once, through one ``alltoall`` (Gloo's alltoallv posts
  every send and receive together).  A joiner then receives the S bytes from
  K donors in parallel, so its own inbound link bounds the time, not rank
  0's outbound link or a tree's depth; ranks that need nothing receive
  nothing.

Every way copies bytes and never does arithmetic on them, so -0.0, NaN payloads
and integer or bool tensors arrive exactly.

GPU tensors (NCCL): the commit buffer is host memory, so the digests and the
plan stay as they are.  The transfer would move the buckets host to host as
here; moving them device to device instead needs device staging buffers and
NCCL's alltoall (Horovod has it), which is not built.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Callable, Iterable, NamedTuple, Sequence

import torch
import xxhash

from hvd_elastic.training._internal import comm
from hvd_elastic.training._internal.flat import FlatBuffer, as_bytes

#: The world size from which a unit only rank 0 holds is relayed (about S/B whatever the size)
#: rather than broadcast (Gloo's tree: one S/B per level; with 2 ranks that is one send).
RELAY_FROM = 3

#: The most bytes of one relay step (a piece of a unit).  Filling and draining the relay's pipeline
#: costs one piece time, so pieces are small beside a state; each step costs one collective's
#: negotiation, so not tiny (16 MiB is 0.13 s at 1 Gbit/s, 13 ms at 10).
RELAY_PIECE_BYTES = 16 << 20

#: Rows of a rank's digest table: row 0 says whether the rank has a buffer of
#: rank 0's layout at all; row 1 + i holds tensor i's 128-bit digest as two int64.
HAS_STATE = 1


def new_lineage() -> tuple[int, int]:
    """A lineage no other rank's committed tensors have: a random origin, no saves yet."""
    return (secrets.randbits(63), 0)


def empty_table(count: int) -> torch.Tensor:
    """A digest table that says "no state" until :func:`hash_into` fills it."""
    return torch.zeros((1 + count, 2), dtype=torch.int64)


def hash_into(table: torch.Tensor, buffer: FlatBuffer, indices: Iterable[int]) -> None:
    """Hash tensors ``indices`` of ``buffer`` into their rows of ``table``, which then says
    "has state": the caller hashes every tensor before the table is compared."""
    table[0, 0] = HAS_STATE
    rows = table.numpy()
    for i in indices:
        # .data: the array's own bytes as a memoryview (numpy's stub declares no buffer protocol before 3.12)
        h = xxhash.xxh3_128_intdigest(as_bytes(buffer.span([i])).numpy().data)
        # Two's-complement halves: the table is int64, the digest an unsigned 128-bit int.
        rows[1 + i] = (_signed(h >> 64), _signed(h & 0xFFFF_FFFF_FFFF_FFFF))


def _signed(half: int) -> int:
    return half - (1 << 64) if half >= 1 << 63 else half


@dataclasses.dataclass(frozen=True)
class Plan:
    """What each rank needs, as every rank computes it from the same gathered tables.

    ``needs[r]`` is the set of tensor indices rank ``r`` must receive: all of
    them for a rank without state, none for rank 0.
    """

    needs: tuple[frozenset[int], ...]

    @property
    def receivers(self) -> tuple[int, ...]:
        return tuple(r for r, need in enumerate(self.needs) if need)

    @classmethod
    def lacking(cls, size: int, count: int, ranks: Iterable[int]) -> "Plan":
        """``ranks`` need every tensor, the others none (what lineages alone can tell)."""
        every, ranks = frozenset(range(count)), set(ranks)
        return cls(tuple(every if r in ranks else frozenset() for r in range(size)))

    def __or__(self, other: "Plan") -> "Plan":
        return Plan(tuple(a | b for a, b in zip(self.needs, other.needs)))


def plan(tables: torch.Tensor) -> Plan:
    """The plan from the gathered tables, shape ``(size, 1 + count, 2)`` in rank order."""
    size, rows, _ = tables.shape
    count = rows - 1
    reference = tables[0, 1:]
    needs: list[frozenset[int]] = [frozenset()]
    for r in range(1, size):
        if int(tables[r, 0, 0]) != HAS_STATE:
            needs.append(frozenset(range(count)))
            continue
        differs = (tables[r, 1:] != reference).any(dim=1).nonzero().flatten().tolist()
        needs.append(frozenset(differs))
    return Plan(tuple(needs))


@dataclasses.dataclass(frozen=True)
class Unit:
    """One transfer: a contiguous range of one dtype's buffer, the same ranks needing all of it.

    Every rank outside ``receivers`` holds all of it exactly: those are its ``donors``.
    """

    indices: tuple[int, ...]
    data: torch.Tensor
    receivers: tuple[int, ...]
    donors: tuple[int, ...]

    @property
    def method(self) -> str:
        """How the unit travels.  When rank 0 is the one donor (everyone else receives):
        ``broadcast`` (Gloo's tree, in place) in worlds smaller than :data:`RELAY_FROM`, else
        ``relay`` (rank 0 sends each receiver one stripe, which the receivers pass on to each
        other while the next unit's stripes arrive: :func:`_relay`).  Otherwise ``stripes`` (one
        alltoall: each donor sends a stripe to each receiver)."""
        if self.donors != (0,):
            return "stripes"
        return "broadcast" if 1 + len(self.receivers) < RELAY_FROM else "relay"


def units(buffer: FlatBuffer, chosen: Plan, bucket_bytes: int) -> list[Unit]:
    """The transfers ``chosen`` needs, in buffer order: runs of neighbouring tensors that the
    same ranks need, cut at about ``bucket_bytes`` (a tensor is never cut)."""
    size = len(chosen.needs)
    found: list[Unit] = []
    for bucket in buffer.buckets(bucket_bytes):
        run: list[int] = []
        run_receivers: tuple[int, ...] = ()
        for i in bucket.indices + [None]:
            receivers = () if i is None else tuple(r for r in range(size) if i in chosen.needs[r])
            if run and receivers != run_receivers:
                if run_receivers:
                    found.append(_unit(buffer, run, run_receivers, size))
                run = []
            if i is not None:
                run.append(i)
                run_receivers = receivers
    return found


def _unit(buffer: FlatBuffer, indices: list[int], receivers: tuple[int, ...], size: int) -> Unit:
    donors = tuple(r for r in range(size) if r not in receivers)
    return Unit(tuple(indices), buffer.span(indices), receivers, donors)


def methods(todo: Sequence[Unit]) -> str:
    """How a sync moved its tensors: ``none``, or the units' methods joined by ``+`` in
    alphabetical order (``broadcast``, ``relay+stripes``, ``stripes``, ...)."""
    used = sorted({u.method for u in todo})
    return "+".join(used) if used else "none"


def stripe_bounds(length: int, donors: int) -> list[int]:
    """Offsets splitting ``length`` bytes into ``donors`` nearly equal, disjoint stripes."""
    return [length * k // donors for k in range(donors + 1)]


def transfer(todo: Sequence[Unit], *, rank: int, name: str, fill: Callable[[list[int]], None] | None = None,
             unpack: Callable[[list[int]], None] | None = None, window_bytes: int,
             meanwhile: list[Callable[[], None]] | None = None) -> tuple[int, int]:
    """Move every unit of ``todo`` (from :func:`units`) into the buffers of its receivers.

    Collective: every rank calls it with the same units of a buffer of the
    same layout.  ``fill(indices)``, when given, is called just before a unit
    is sent (rank 0 copies its live tensors in while the previous unit is on
    the wire).  On a receiver ``unpack(indices)`` is called for each unit as
    soon as it has arrived, while later units are on the wire; at most about
    ``window_bytes`` are in flight (a receiver's scratch memory).  While it
    waits for a unit, it takes work from the front of ``meanwhile`` (small
    callables, run on this thread while Horovod's moves bytes); what is left
    when the last unit has arrived stays in the list.  Returns ``(bytes
    sent, bytes received)`` by this rank.
    """
    collectives = comm.required()
    size = collectives.size()
    sent = received = 0
    in_flight: list[tuple[Unit, comm.Handle, int]] = []

    def finish() -> int:
        unit, handle, _ = in_flight.pop(0)
        while meanwhile and not handle.done():
            meanwhile.pop(0)()
        result = handle.wait()
        if rank not in unit.receivers:
            return 0
        if unit.method == "stripes":
            # Stripes arrive in donor order, which is rank order, which is byte order.
            as_bytes(unit.data).copy_(result)
        if unpack is not None:
            unpack(list(unit.indices))
        return _nbytes(unit.data)

    for i, unit in enumerate(u for u in todo if u.method != "relay"):
        if fill is not None:
            fill(list(unit.indices))
        handle, nbytes = _post(collectives, unit, rank=rank, size=size, name=f"{name}.{i}")
        sent += nbytes
        in_flight.append((unit, handle, _nbytes(unit.data)))
        while len(in_flight) > 1 and sum(n for _, _, n in in_flight) > window_bytes:
            received += finish()
    while in_flight:
        received += finish()
    relayed = _relay(collectives, [u for u in todo if u.method == "relay"], rank=rank, size=size,
                     name=f"{name}.relay", fill=fill, unpack=unpack)
    return sent + relayed[0], received + relayed[1]


def _post(collectives: comm.Comm, unit: Unit, *, rank: int, size: int, name: str) -> tuple[comm.Handle, int]:
    """Start moving a broadcast or striped ``unit``: its handle, and the bytes this rank sends."""
    raw = as_bytes(unit.data)
    if unit.method == "broadcast":
        return collectives.broadcast_(raw, 0, name=name), raw.numel() if rank == 0 else 0
    bounds = stripe_bounds(raw.numel(), len(unit.donors))
    send, recv = [0] * size, [0] * size
    payload = raw[:0]
    if rank in unit.donors:
        k = unit.donors.index(rank)
        stripe = raw[bounds[k]: bounds[k + 1]]
        for r in unit.receivers:
            send[r] = stripe.numel()
        payload = stripe if len(unit.receivers) == 1 else torch.cat([stripe] * len(unit.receivers))
    if rank in unit.receivers:  # each donor's stripe, in donor order
        for k, donor in enumerate(unit.donors):
            recv[donor] = bounds[k + 1] - bounds[k]
    return collectives.alltoall(payload, send, recv, name=name), payload.numel()


def _relay(collectives: comm.Comm, todo: Sequence[Unit], *, rank: int, size: int, name: str,
           fill: Callable[[list[int]], None] | None,
           unpack: Callable[[list[int]], None] | None) -> tuple[int, int]:
    """Move units only rank 0 holds to every other rank, one ``alltoall`` per step.

    The units are cut into pieces of at most :data:`RELAY_PIECE_BYTES`.  Step
    ``t`` does two things at once: rank 0 sends each receiver its own stripe
    of piece ``t`` (receiver ``k`` gets stripe ``k - 1`` of ``size - 1``), and
    every receiver sends the stripe of piece ``t - 1`` it got in the step
    before to every other receiver.  After step ``t`` a receiver holds piece
    ``t - 1`` whole.  Each link carries about one piece per step, so ``P``
    pieces take ``P + 1`` piece times: close to S/B whatever the size, where
    a broadcast tree takes one S/B per level.  A step is posted as soon as
    the one before has arrived, and only then are that step's bytes copied
    into the buffer (and a completed unit unpacked): the copies hide behind
    the next step instead of leaving the links idle between steps.
    """
    pieces = [piece for unit in todo for piece in _pieces(unit)]
    receivers = range(1, size)
    sent = received = 0

    def post(step: int, before: torch.Tensor | None) -> comm.Handle:
        """Start ``step``'s alltoall; ``before`` is what the step before brought this rank."""
        nonlocal sent
        splits = [0] * size
        payload = torch.empty(0, dtype=torch.uint8)
        if rank == 0 and step < len(pieces):
            piece = pieces[step]
            if fill is not None and piece.first:
                fill(list(piece.unit.indices))  # the whole unit copied in before its first piece goes
            payload = piece.data  # stripes 0 .. size - 2 in order: the piece itself
            bounds = stripe_bounds(payload.numel(), size - 1)
            for k in receivers:
                splits[k] = bounds[k] - bounds[k - 1]
        elif rank != 0 and step > 0:
            if before is None:  # only step 0 is posted before anything arrived
                raise RuntimeError(f"{name}: relay step {step} posted without what step {step - 1} brought")
            # This rank's stripe of the previous piece, straight from what rank 0 sent it.
            mine = before[: _stripe(pieces[step - 1], rank, size).numel()]
            for k in receivers:
                splits[k] = mine.numel() if k != rank else 0
            payload = mine if size == 3 else torch.cat([mine] * (size - 2))
        sent += payload.numel()
        return collectives.alltoall(payload, splits, _relay_receives(pieces, step, rank, size), name=f"{name}.{step}")

    handle = post(0, None)
    for step in range(len(pieces) + 1):
        arrived = handle.wait()
        if step < len(pieces):
            handle = post(step + 1, arrived)
        if rank != 0:
            received += _land(pieces, step, arrived, rank=rank, size=size, unpack=unpack)
    return sent, received


def _relay_receives(pieces: list[_Piece], step: int, rank: int, size: int) -> list[int]:
    """What relay ``step`` brings ``rank``, from each rank: its stripe of the current piece from rank 0, and
    each other receiver's stripe of the piece before."""
    recv = [0] * size
    if rank == 0:
        return recv
    if step < len(pieces):
        recv[0] = _stripe(pieces[step], rank, size).numel()
    if step > 0:
        for other in range(1, size):
            if other != rank:
                recv[other] = _stripe(pieces[step - 1], other, size).numel()
    return recv


def _land(pieces: list[_Piece], step: int, arrived: torch.Tensor, *, rank: int, size: int,
          unpack: Callable[[list[int]], None] | None) -> int:
    """Copy what relay ``step`` brought a receiver into its buffer; unpack a unit it completed."""
    at = 0
    if step < len(pieces):  # from rank 0: this rank's stripe of the current piece
        mine = _stripe(pieces[step], rank, size)
        mine.copy_(arrived[: mine.numel()])
        at = mine.numel()
    if step == 0:
        return 0
    piece = pieces[step - 1]
    for k in range(1, size):  # from every other receiver, in rank order: the rest of the previous piece
        if k != rank:
            theirs = _stripe(piece, k, size)
            theirs.copy_(arrived[at: at + theirs.numel()])
            at += theirs.numel()
    if piece.last and unpack is not None:
        unpack(list(piece.unit.indices))
    return piece.data.numel()


class _Piece(NamedTuple):
    """One relay step's bytes: a range of ``unit``'s bytes, maybe its ``first`` or ``last``."""

    unit: Unit
    data: torch.Tensor
    first: bool
    last: bool


def _pieces(unit: Unit) -> list[_Piece]:
    """A relayed unit's bytes cut into pieces of at most :data:`RELAY_PIECE_BYTES`."""
    raw = as_bytes(unit.data)
    cuts = list(range(0, raw.numel(), RELAY_PIECE_BYTES)) + [raw.numel()]
    return [_Piece(unit, raw[lo:hi], lo == 0, hi == raw.numel()) for lo, hi in zip(cuts, cuts[1:])]


def _stripe(piece: _Piece, receiver: int, size: int) -> torch.Tensor:
    """Receiver ``receiver``'s stripe of a relayed piece (a view of its bytes)."""
    bounds = stripe_bounds(piece.data.numel(), size - 1)
    return piece.data[bounds[receiver - 1]: bounds[receiver]]


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
