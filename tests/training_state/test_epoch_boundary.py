"""A pass over an exhausted epoch, under every DataLoader configuration (single process, no Horovod).

A reset or a resume that lands on an epoch's last commit re-enters the training
loop with the epoch exhausted but not yet advanced: that pass must yield
nothing and end cleanly.  A loop that never calls ``set_epoch`` must still be
refused.  A DataLoader with worker processes calls ``iter()`` on its batch
sampler twice per pass, so these are run through real loaders, not ``iter()``.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from hvd_elastic.training.sampler import ExactlyOnceSampler

SAMPLES, BATCH = 10, 5


class Indices(Dataset):
    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        return torch.tensor(i)


def _torch_loader(**kw):
    return lambda sampler: DataLoader(Indices(), batch_sampler=sampler, collate_fn=ExactlyOnceSampler.collate(), **kw)


def _stateful_loader(**kw):
    def make(sampler):
        stateful = pytest.importorskip("torchdata.stateful_dataloader")
        return stateful.StatefulDataLoader(Indices(), batch_sampler=sampler,
                                           collate_fn=ExactlyOnceSampler.collate(), **kw)
    return make


LOADERS = {
    "workers=0": _torch_loader(),
    "workers=1": _torch_loader(num_workers=1),
    "workers=2,prefetch=1": _torch_loader(num_workers=2, prefetch_factor=1),
    "workers=2,prefetch=4": _torch_loader(num_workers=2, prefetch_factor=4),
    "workers=1,persistent": _torch_loader(num_workers=1, persistent_workers=True),
    "workers=2,persistent,prefetch=3": _torch_loader(num_workers=2, persistent_workers=True, prefetch_factor=3),
    "workers=2,in_order=False": _torch_loader(num_workers=2, in_order=False),
    "stateful,workers=0": _stateful_loader(),
    "stateful,workers=2": _stateful_loader(num_workers=2),
    "stateful,workers=1,persistent": _stateful_loader(num_workers=1, persistent_workers=True),
}
configs = pytest.mark.parametrize("make_loader", LOADERS.values(), ids=LOADERS.keys())


def train_epoch(loader, sampler) -> list[int]:
    seen = []
    for batch in loader:
        seen += batch.tolist()
        sampler.record_batch()
    return seen


@configs
def test_the_issue_reproduction_yields_nothing_instead_of_raising(make_loader):
    """Two steps recorded (the epoch's last commit), then the loop re-enters the same epoch."""
    sampler = ExactlyOnceSampler(SAMPLES, BATCH, rank=0, world_size=1)
    sampler.record_batch()
    sampler.record_batch()
    sampler.set_epoch(0)
    assert list(make_loader(sampler)) == []


@configs
def test_a_loop_that_never_calls_set_epoch_is_refused_at_its_second_epoch(make_loader):
    sampler = ExactlyOnceSampler(SAMPLES, BATCH, rank=0, world_size=1, seed=3)
    loader = make_loader(sampler)
    assert sorted(train_epoch(loader, sampler)) == list(range(SAMPLES))
    with pytest.raises(RuntimeError, match=r"epoch 0 is exhausted .* call sampler.set_epoch\(epoch\)"):
        train_epoch(loader, sampler)  # "epoch 1", but set_epoch(1) was forgotten


@configs
def test_restore_or_resume_on_the_last_commit_then_the_next_epoch(make_loader):
    """The loop of the issue, with the state restored from the epoch's last commit (as a reset or a
    resume from a checkpoint does): the exhausted pass is empty, the next epoch is whole, and a
    second pass over that epoch without set_epoch is still refused."""
    sampler = ExactlyOnceSampler(SAMPLES, BATCH, rank=0, world_size=1, seed=3)
    loader = make_loader(sampler)
    sampler.set_epoch(0)
    train_epoch(loader, sampler)
    committed = sampler.state_dict()  # epoch 0 complete, not yet advanced

    resumed = ExactlyOnceSampler(SAMPLES, BATCH, rank=0, world_size=1)  # a relaunched job
    resumed.load_state_dict(committed)
    for s, lo in ((sampler, loader), (resumed, make_loader(resumed))):
        s.load_state_dict(committed)  # the restore of a reset (a no-op position change for `resumed`)
        s.set_epoch(0)
        assert train_epoch(lo, s) == []
        s.set_epoch(1)
        assert sorted(train_epoch(lo, s)) == list(range(SAMPLES))
        with pytest.raises(RuntimeError, match="epoch 1 is exhausted"):
            train_epoch(lo, s)


@configs
def test_a_reset_that_repartitions_at_the_end_of_an_epoch_yields_nothing(make_loader):
    """A removal-only reset calls set_world (no restore): the re-entered pass is empty too."""
    sampler = ExactlyOnceSampler(SAMPLES, BATCH, rank=0, world_size=1)
    loader = make_loader(sampler)
    train_epoch(loader, sampler)
    sampler.set_world(0, 1)
    assert train_epoch(loader, sampler) == []


def test_an_iterator_that_is_created_but_never_drawn_is_not_a_pass():
    """What a DataLoader with workers does to its batch sampler: iter() twice, draw from the second."""
    sampler = ExactlyOnceSampler(SAMPLES, BATCH, rank=0, world_size=1)
    sampler.record_batch(2)
    sampler.set_epoch(0)
    iter(sampler)
    assert list(iter(sampler)) == []
    with pytest.raises(RuntimeError, match="iterated again"):
        list(iter(sampler))
