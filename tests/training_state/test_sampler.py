"""ExactlyOnceSampler arithmetic: partitions, resizes, tails, state (single process, no Horovod)."""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from hvd_elastic.training.sampler import ExactlyOnceSampler


def world(n, batch, size, **kw):
    return [ExactlyOnceSampler(n, batch, rank=r, world_size=size, **kw) for r in range(size)]


def run_steps(samplers, steps=None):
    """Take `steps` global steps (all if None) on every rank; return the indices processed."""
    iters = [iter(s) for s in samplers]
    counts = {len(s) for s in samplers}
    assert len(counts) == 1, f"ranks disagree on the number of steps: {counts}"
    total = counts.pop() if steps is None else steps
    seen = []
    for _ in range(total):
        batches = [next(it) for it in iters]
        for b in batches:
            seen.extend(b)
        for s in samplers:
            s.record_batch()
    return seen


@pytest.mark.parametrize("n,batch,size", [(100, 8, 3), (17, 4, 4), (5, 2, 8), (64, 8, 2), (1, 1, 1), (0, 3, 2)])
def test_one_epoch_covers_every_index_once(n, batch, size):
    seen = run_steps(world(n, batch, size))
    assert sorted(seen) == list(range(n))


def test_tail_never_leaves_a_rank_without_a_batch_when_enough_samples_remain():
    # 10 samples, 2 ranks x 4: a full step of 8, then 2 left (== world): a step of 1 each.
    # 9 samples, 4 ranks x 2: a step of 8 leaves 1 < 4 ranks: merged into one step of 9.
    for n, batch, size in [(10, 4, 2), (9, 2, 4), (103, 5, 4)]:
        samplers = world(n, batch, size)
        batches = [list(iter(s)) for s in samplers]
        for step in zip(*batches):
            assert all(len(b) >= 1 for b in step), (n, batch, size, step)
            assert max(map(len, step)) - min(map(len, step)) <= 1


def test_random_resize_schedule_keeps_exactly_once():
    rng = random.Random(1)
    for trial in range(30):
        n = rng.randint(0, 300)
        batch = rng.randint(1, 9)
        state = ExactlyOnceSampler(n, batch).state_dict()
        seen = []
        while state["offset"] < n:
            size = rng.randint(1, 6)
            samplers = world(n, batch, size)
            for s in samplers:
                s.load_state_dict(state)
            steps = min(len(samplers[0]), rng.randint(1, 4))
            seen += run_steps(samplers, steps)
            # a crash mid-epoch: batches drawn, the steps since the commit simply not recorded
            # (at the epoch's end a crash restores first, see test_epoch_boundary.py)
            if rng.random() < 0.3 and samplers[0].remaining:
                for it in [iter(s) for s in samplers]:
                    next(it, None)
            state = samplers[0].state_dict()
            assert all(s.state_dict() == state for s in samplers)
        assert sorted(seen) == list(range(n)), trial


def test_remaining_fewer_than_ranks_gives_empty_batches_to_the_rest():
    samplers = world(20, 2, 8)
    for s in samplers:
        s.load_state_dict({**s.state_dict(), "offset": 17})
    batches = [list(iter(s)) for s in samplers]
    assert [len(b) for b in batches] == [1] * 8
    assert [len(b[0]) for b in batches] == [1, 1, 1, 0, 0, 0, 0, 0]
    assert sorted(i for b in batches for i in b[0]) == sorted(samplers[0].order()[17:].tolist())


def test_shuffle_is_deterministic_by_seed_and_epoch():
    a, b = ExactlyOnceSampler(50, 5, seed=3), ExactlyOnceSampler(50, 5, seed=3)
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first
    assert list(ExactlyOnceSampler(50, 5, seed=4)) != first
    assert list(ExactlyOnceSampler(50, 5, shuffle=False))[0] == [0, 1, 2, 3, 4]


def test_iteration_does_not_move_the_position_only_record_batch_does():
    s = ExactlyOnceSampler(40, 4)
    it = iter(s)
    prefetched = [next(it) for _ in range(5)]  # what a prefetching DataLoader does
    assert s.offset == 0 and len(s) == 10
    s.record_batch(2)
    assert s.offset == 8 and len(s) == 8
    assert s.processed_indices().tolist() == prefetched[0] + prefetched[1]
    assert list(iter(s))[0] == prefetched[2]


def test_set_epoch_keeps_position_of_the_current_epoch():
    s = ExactlyOnceSampler(40, 4)
    s.record_batch(3)
    s.set_epoch(0)
    assert s.offset == 12
    s.set_epoch(1)
    assert (s.epoch, s.offset) == (1, 0)


def test_record_past_the_end_is_an_error():
    s = ExactlyOnceSampler(8, 4)
    s.record_batch(2)
    with pytest.raises(RuntimeError, match="past the end of epoch 0"):
        s.record_batch()


def test_bad_arguments_and_state_are_rejected():
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        ExactlyOnceSampler(10, 0)
    with pytest.raises(ValueError, match="rank must be in"):
        ExactlyOnceSampler(10, 2, rank=2, world_size=2)
    s = ExactlyOnceSampler(10, 2)
    with pytest.raises(ValueError, match="sampler state is for 11 samples"):
        s.load_state_dict({**s.state_dict(), "num_samples": 11})
    with pytest.raises(ValueError, match="offset 12 outside"):
        s.load_state_dict({**s.state_dict(), "offset": 12})


def test_step_samples_override_splits_uneven_global_batches():
    s0, s1, s2 = [ExactlyOnceSampler(30, 1, rank=r, world_size=3) for r in range(3)]
    for s in (s0, s1, s2):
        s.set_world(s.rank, 3, step_samples=10)
    sizes = [len(next(iter(s))) for s in (s0, s1, s2)]
    assert sizes == [4, 3, 3] and s0.local_batch_size == 4


class Squares(Dataset):
    def __len__(self):
        return 37

    def __getitem__(self, i):
        return torch.tensor(i)


def test_dataloader_with_workers_and_prefetch_sees_the_same_batches():
    s = ExactlyOnceSampler(37, 5, rank=1, world_size=2)
    expected = list(iter(s))
    loader = DataLoader(Squares(), batch_sampler=s, num_workers=2, prefetch_factor=4,
                        collate_fn=ExactlyOnceSampler.collate())
    got = []
    for batch in loader:
        got.append(batch.tolist())
        s.record_batch()
    assert got == expected and s.remaining == 0


def test_collate_turns_an_empty_batch_into_none():
    collate = ExactlyOnceSampler.collate()
    assert collate([]) is None
    assert collate([torch.tensor(1), torch.tensor(2)]).tolist() == [1, 2]


def test_torchdata_stateful_dataloader_resumes_at_the_recorded_position():
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    sampler = ExactlyOnceSampler(37, 3, rank=0, world_size=2, seed=5)
    loader = stateful.StatefulDataLoader(Squares(), batch_sampler=sampler, num_workers=2,
                                         collate_fn=ExactlyOnceSampler.collate())
    for i, batch in enumerate(loader):
        if i == 2:
            saved = loader.state_dict()  # three batches yielded (3 steps of 2 x 3 samples)
            break
    assert saved["_snapshot"]["_main_snapshot"]["_sampler_iter_state"]["offset"] == 18

    # a new process (and a new world of one) resumes from the loader's state
    resumed = ExactlyOnceSampler(37, 3, rank=0, world_size=1, seed=5)
    loader = stateful.StatefulDataLoader(Squares(), batch_sampler=resumed, num_workers=2,
                                         collate_fn=ExactlyOnceSampler.collate())
    loader.load_state_dict(saved)
    rest = []
    for batch in loader:
        rest += batch.tolist()
        resumed.record_batch()
    assert sorted(rest) == sorted(resumed.order()[18:].tolist())



def test_samples_this_step_is_the_drawn_steps_global_size_through_uneven_and_idle_steps():
    """The loss scale: every step's ``samples_this_step`` equals the samples the ranks drew for it
    together, on full steps split unevenly (10 over 3 ranks) and on the tail that absorbs a
    remainder; after the epoch's end it is refused, not 0 (a division by zero)."""
    samplers = world(47, None, 3)
    for s in samplers:
        s.set_world(s.rank, 3, step_samples=10)
    iters = [iter(s) for s in samplers]
    drawn = []
    for _ in range(len(samplers[0])):
        batches = [next(it) for it in iters]
        drawn.append(([len(b) for b in batches], {s.samples_this_step for s in samplers}))
        for s in samplers:
            s.record_batch()
    assert drawn == [([4, 3, 3], {10})] * 4 + [([3, 2, 2], {7})]
    with pytest.raises(RuntimeError, match="samples_this_step read after the end of epoch 0 .*no step is in progress"):
        samplers[0].samples_this_step


def test_samples_this_step_counts_only_the_samples_of_a_step_with_idle_ranks():
    """A world of 3 resuming with 2 samples left in the epoch (a smaller world's commit): rank 2
    is idle, and the scale is the 2 samples trained, not the nominal step."""
    samplers = world(47, None, 3)
    for s in samplers:
        s.set_world(s.rank, 3, step_samples=10)
        s.load_state_dict({**s.state_dict(), "offset": 45})
    assert [len(next(iter(s))) for s in samplers] == [1, 1, 0]
    assert [s.samples_this_step for s in samplers] == [2, 2, 2]


def _first_step_under_torch_distributed(rank: int, port: int, out) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        sampler = ExactlyOnceSampler(10, 2, seed=0)  # no rank given: torch.distributed's, as under torchrun
        out.put((rank, sampler.rank, sampler.world_size, next(iter(sampler))))
    finally:
        dist.destroy_process_group()


def test_without_horovod_the_world_is_torch_distributeds():
    import torch.multiprocessing as mp

    from hvd_elastic.local import ports

    port, = ports.reserve(1)
    context = mp.get_context("spawn")
    out = context.Queue()
    mp.start_processes(_first_step_under_torch_distributed, args=(port, out), nprocs=2, start_method="spawn")
    got = sorted(out.get(timeout=60) for _ in range(2))
    assert [(rank, seen_rank, size) for rank, seen_rank, size, _ in got] == [(0, 0, 2), (1, 1, 2)]
    single = ExactlyOnceSampler(10, 2, seed=0)
    assert (single.rank, single.world_size) == (0, 1)  # no process group in this process
    first_step = next(iter(ExactlyOnceSampler(10, 4, seed=0)))
    assert sorted(got[0][3] + got[1][3]) == sorted(first_step)  # the two ranks split one global step
