"""The state library's collectives under torch.distributed (a torchrun job's world), with real Gloo process
groups: object collectives, and a sync's two rounds moving only what ranks lack by stripes, broadcast and
relay, each rank ending with rank 0's bytes (hvd_elastic.training._internal.comm, sync, transfer)."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from hvd_elastic.local import ports
from hvd_elastic.training._internal import comm, objects, sync, transfer
from hvd_elastic.training._internal.flat import FlatBuffer, FlatLayout

pytestmark = pytest.mark.slow

SIZE = 4


def tensors(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    special = torch.tensor([-0.0, 0.0, 1.0])
    special.view(torch.int32)[1] = 0x7FC00123 + seed  # a NaN with a payload: bytes, not values, must match
    return {"w": torch.randn(64, 33, generator=generator), "b": torch.randn(33, generator=generator),
            "special": special, "count": torch.arange(7, dtype=torch.int64) + seed,
            "mask": torch.tensor([True, False, bool(seed % 2)])}


def buffer_of(named: dict[str, torch.Tensor]) -> FlatBuffer:
    buffer = FlatBuffer(FlatLayout.of(named.items()), pin_memory=False)
    buffer.copy_from(list(named.values()))
    return buffer


def digest(buffer: FlatBuffer) -> list[str]:
    return [bytes(view.contiguous().view(torch.uint8).numpy()).hex() for view in buffer.views]


def scenario(rank: int, name: str) -> FlatBuffer:
    """Rank 0's commit, and what each other rank holds: ``joiner``: rank 1 and 2 share it, rank 3 is new;
    ``diverged``: as joiner, but rank 1's bytes moved under the same lineage; ``newcomers``: only rank 0
    has it."""
    holds = {"joiner": {0, 1, 2}, "diverged": {0, 1, 2}, "newcomers": {0}}[name]
    named = tensors(0) if rank in holds else tensors(100 + rank)
    if name == "diverged" and rank == 1:
        named["w"][3, 3] += 1.0
    return buffer_of(named)


def _run(rank: int, port: int, out) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=SIZE)
    try:
        assert comm.current() is comm.TORCH and comm.world() == (rank, SIZE)
        gathered = objects.allgather_object((rank, "x" * 100 * rank), name="t.gather")
        told = objects.broadcast_object({"from": rank}, root_rank=2, name="t.bcast")
        results = {"gathered": gathered, "told": told}
        for name, relay_from in (("joiner", 3), ("diverged", 3), ("newcomers", 5), ("newcomers", 3)):
            transfer.RELAY_FROM = relay_from  # a world of 4 broadcasts below 5, relays from 3
            buffer = scenario(rank, name)
            sharers = {"joiner": [1, 2], "diverged": [1, 2], "newcomers": []}[name]
            moved = sync.move(buffer, sharers=sharers, hashing=rank in [0, *sharers], copying=False, live=[],
                              unpack=lambda indices: None, bucket_bytes=2048)
            results[f"{name}@{relay_from}"] = (digest(buffer), moved.method, moved.proof, moved.received)
        out.put((rank, results))
    finally:
        dist.destroy_process_group()


def test_a_torch_distributed_world_syncs_and_gathers_as_a_horovod_one():
    port, = ports.reserve(1)
    queue = mp.get_context("spawn").Queue()
    ranks = mp.start_processes(_run, args=(port, queue), nprocs=SIZE, start_method="spawn", join=False)
    results = dict(queue.get(timeout=120) for _ in range(SIZE))  # before the join: a full pipe blocks an exit
    while not ranks.join(timeout=60):
        pass
    expected = digest(buffer_of(tensors(0)))
    for rank, got in results.items():
        assert got["gathered"] == [(r, "x" * 100 * r) for r in range(SIZE)]
        assert got["told"] == {"from": 2}
        for key in ("joiner@3", "diverged@3", "newcomers@5", "newcomers@3"):
            assert got[key][0] == expected, f"rank {rank} after {key}: not rank 0's bytes"
    by = {key: {rank: got[key][1:] for rank, got in results.items()} for key in results[0] if "@" in key}
    assert by["joiner@3"][3][0] == "stripes" and by["joiner@3"][1][2] == 0  # the sharers got nothing
    assert by["diverged@3"][1][1] == "digests" and by["diverged@3"][1][2] > 0  # the digests found rank 1's bytes
    assert by["newcomers@5"][1][0] == "broadcast" and by["newcomers@3"][1][0] == "relay"
