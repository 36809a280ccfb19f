"""The sync's plan without Horovod: digests, who needs what, and the transfer units."""

from __future__ import annotations

import threading

import pytest
import torch

from hvd_elastic.training._internal import transfer
from hvd_elastic.training._internal.flat import FlatBuffer, FlatLayout, as_bytes
from hvd_elastic.training._internal.transfer import RELAY_FROM, Plan, empty_table, hash_into, plan, stripe_bounds, units


def buffer_of(tensors: dict[str, torch.Tensor]) -> FlatBuffer:
    buffer = FlatBuffer(FlatLayout.of(tensors.items()), pin_memory=False)
    buffer.copy_from(list(tensors.values()))
    return buffer


def digests(buffer: FlatBuffer | None, count: int) -> torch.Tensor:
    """A rank's whole digest table as a sync builds it: every tensor of its buffer, or "no state"."""
    table = empty_table(count)
    if buffer is not None:
        hash_into(table, buffer, range(count))
    return table


def state(**changes) -> dict[str, torch.Tensor]:
    tensors = {
        "w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "b": torch.zeros(4),
        "count": torch.tensor([7], dtype=torch.int64),
        "mask": torch.tensor([True, False]),
        "half": torch.ones(3, dtype=torch.bfloat16),
    }
    tensors.update(changes)
    return tensors


def test_equal_buffers_have_equal_digests_and_every_bit_counts():
    reference = digests(buffer_of(state()), 5)
    assert reference[0, 0] == 1 and torch.equal(reference, digests(buffer_of(state()), 5))
    nan = torch.zeros(4)
    nan.view(torch.int32)[1] = 0x7FC00001  # a NaN with a payload
    other_nan = nan.clone()
    other_nan.view(torch.int32)[1] = 0x7FC00002
    for changed in (dict(b=torch.tensor([-0.0, 0.0, 0.0, 0.0])),  # -0.0 == 0.0 as floats, not as bits
                    dict(mask=torch.tensor([True, True])),
                    dict(count=torch.tensor([8])),
                    dict(half=torch.tensor([1.0, 1.0, 1.0078125], dtype=torch.bfloat16))):
        table = digests(buffer_of(state(**changed)), 5)
        differs = (table[1:] != reference[1:]).any(dim=1).nonzero().flatten().tolist()
        assert differs == [list(state()).index(next(iter(changed))) ], changed
    assert not torch.equal(digests(buffer_of(state(b=nan)), 5), digests(buffer_of(state(b=other_nan)), 5))
    assert digests(None, 5).abs().sum() == 0  # no state: every tensor is needed


def test_plan_sends_each_rank_what_differs_and_everything_to_a_rank_without_state():
    tables = torch.stack([
        digests(buffer_of(state()), 5),
        digests(buffer_of(state()), 5),                       # a survivor: nothing
        digests(buffer_of(state(count=torch.tensor([9]))), 5),  # a step behind: the counter
        digests(None, 5),                                      # a joiner: all
    ])
    chosen = plan(tables)
    assert chosen.needs == (frozenset(), frozenset(), frozenset({2}), frozenset(range(5)))
    assert chosen.receivers == (2, 3)


def test_round_one_sends_all_to_the_ranks_outside_the_lineage_and_round_two_adds_what_differs():
    first = Plan.lacking(4, 3, [3])
    assert first.needs == (frozenset(), frozenset(), frozenset(), frozenset({0, 1, 2}))
    second = Plan((frozenset(), frozenset({1}), frozenset(), frozenset({2})))
    assert (first | second).needs == (frozenset(), frozenset({1}), frozenset(), frozenset({0, 1, 2}))
    assert (first | second).receivers == (1, 3)


def test_hashing_piece_by_piece_gives_the_whole_table():
    buffer = buffer_of(state())
    table = empty_table(5)
    assert table[0, 0] == 0  # "no state" until something is hashed
    for i in (3, 0, 4, 1, 2):  # as units arrive, in any order
        hash_into(table, buffer, [i])
    assert torch.equal(table, digests(buffer, 5))


def test_units_are_runs_with_the_same_receivers_and_their_donors_hold_them():
    buffer = buffer_of({f"t{i}": torch.full((256,), float(i)) for i in range(6)})  # 1 KiB each, one dtype
    everything = frozenset(range(6))
    chosen = Plan((frozenset(), frozenset({2, 3}), frozenset(), everything))
    found = units(buffer, chosen, bucket_bytes=4096)
    assert [(u.indices, u.receivers, u.donors) for u in found] == [
        ((0, 1), (3,), (0, 1, 2)), ((2, 3), (1, 3), (0, 2)), ((4, 5), (3,), (0, 1, 2))]
    assert [u.method for u in found] == ["stripes"] * 3
    assert torch.equal(found[1].data, torch.cat([torch.full((256,), 2.0), torch.full((256,), 3.0)]))
    # a small bucket cuts a run; rank 0 alone holding a unit everyone else needs: relayed from
    # RELAY_FROM ranks on, broadcast (one send) below
    cut = units(buffer, Plan((frozenset(), everything, everything)), bucket_bytes=2048)
    assert [u.indices for u in cut] == [(0, 1), (2, 3), (4, 5)] and {u.method for u in cut} == {"relay"}
    assert RELAY_FROM == 3 and cut[0].receivers == (1, 2)
    pair = units(buffer, Plan((frozenset(), everything)), bucket_bytes=2048)
    assert {u.method for u in pair} == {"broadcast"}
    assert units(buffer, Plan((frozenset(),) * 3), bucket_bytes=4096) == []


def test_stripes_cover_a_unit_exactly_once():
    for length, donors in ((10, 3), (1, 4), (0, 2), (1 << 20, 7)):
        bounds = stripe_bounds(length, donors)
        assert bounds[0] == 0 and bounds[-1] == length and bounds == sorted(bounds) and len(bounds) == donors + 1


def test_a_relayed_unit_is_cut_into_pieces_that_cover_it_once_in_order(monkeypatch):
    buffer = buffer_of({"a": torch.arange(1000, dtype=torch.float32), "b": torch.ones(3, dtype=torch.float32)})
    (unit,) = units(buffer, Plan((frozenset(), frozenset({0, 1}), frozenset({0, 1}))), bucket_bytes=1 << 20)
    monkeypatch.setattr(transfer, "RELAY_PIECE_BYTES", 1500)
    pieces = transfer._pieces(unit)
    assert [p.data.numel() for p in pieces] == [1500, 1500, 1012]
    assert [(p.first, p.last) for p in pieces] == [(True, False), (False, False), (False, True)]
    assert torch.equal(torch.cat([p.data for p in pieces]), as_bytes(unit.data))
    assert all(p.data.data_ptr() == as_bytes(unit.data)[1500 * i:].data_ptr() for i, p in enumerate(pieces))


class _ThreadedAlltoall:
    """The seam's ``alltoall`` (:mod:`hvd_elastic.training._internal.comm`) for ranks that are threads of this
    process: enough to run the relay's schedule at any world size without a library.  Each rank's
    ``recv_splits`` must be what really arrives from each rank, as torch.distributed requires."""

    def __init__(self, size: int):
        self.size, self.posted, self.lock = size, {}, threading.Condition()
        self.me = threading.local()

    def alltoall(self, payload, send_splits, recv_splits, *, name):
        with self.lock:
            self.posted.setdefault(name, {})[self.me.rank] = (payload.clone(), list(send_splits))
            self.lock.notify_all()
        return _Arrival(self, name, self.me.rank, list(recv_splits))

    def arrived(self, name, rank, recv_splits):
        with self.lock:
            assert self.lock.wait_for(lambda: len(self.posted[name]) == self.size, timeout=10), name
            parts = []
            for source in range(self.size):
                payload, splits = self.posted[name][source]
                parts.append(payload[sum(splits[:rank]): sum(splits[: rank + 1])])
        assert [p.numel() for p in parts] == recv_splits, (name, rank, recv_splits)
        return torch.cat(parts)


class _Arrival:
    def __init__(self, fake, name, rank, recv_splits):
        self.fake, self.name, self.rank, self.recv_splits = fake, name, rank, recv_splits

    def done(self) -> bool:
        return len(self.fake.posted[self.name]) == self.fake.size

    def wait(self):
        return self.fake.arrived(self.name, self.rank, self.recv_splits)


@pytest.mark.parametrize("size", [3, 4, 5, 8])
def test_the_relay_leaves_every_rank_rank_0_s_bytes_and_unpacks_each_unit_once_in_order(monkeypatch, size):
    fake = _ThreadedAlltoall(size)
    monkeypatch.setattr(transfer, "RELAY_PIECE_BYTES", 999)  # uneven pieces, uneven stripes
    rank_0 = state(w=torch.randn(40, 33), b=torch.tensor([-0.0, float("nan"), 1.0, 2.0]))
    blank = {k: torch.zeros_like(v) for k, v in rank_0.items()}
    buffers = [buffer_of(rank_0)] + [buffer_of(blank) for _ in range(size - 1)]
    everyone = Plan.lacking(size, 5, range(1, size))
    unpacked: list[list[tuple[int, ...]]] = [[] for _ in range(size)]
    results: list = [None] * size

    def rank(r: int):
        fake.me.rank = r
        todo = units(buffers[r], everyone, bucket_bytes=256)
        results[r] = transfer._relay(fake, todo, rank=r, size=size, name="relay", fill=None,
                                     unpack=lambda indices: unpacked[r].append(tuple(indices)))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    nbytes = buffers[0].layout.nbytes
    assert results[0] == (nbytes, 0)  # rank 0 sends the state once, whatever the size
    for r in range(1, size):
        assert all(torch.equal(as_bytes(a), as_bytes(b)) for a, b in zip(buffers[r].views, buffers[0].views))
        assert results[r][1] == nbytes
        assert unpacked[r] == [u.indices for u in units(buffers[0], everyone, bucket_bytes=256)]
