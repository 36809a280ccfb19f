"""The user API fails loudly where it used to fail silently (issue 11), in one process.

Each test here failed against the code before the fix; the docstring says how.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

import horovod.torch as horovod_torch

from hvd_elastic.training.batching import BatchPolicy
from hvd_elastic.training.sampler import ExactlyOnceSampler


class Ema:
    """A stateful helper (like an EMA of the weights) with state_dict/load_state_dict."""

    def __init__(self) -> None:
        self.value = torch.zeros(3)

    def state_dict(self) -> dict:
        return {"value": self.value.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.value.copy_(state["value"])


def test_a_stateful_user_value_is_committed_as_a_component(hvd):
    """Before: ``TrainingState(ema=obj)`` deep-copied ``obj`` as a plain value and
    restore() replaced it, so the live ``obj`` the training code holds never rolled back."""
    from hvd_elastic.training.state import TrainingState

    ema = Ema()
    state = TrainingState(rng=False, ema=ema, step=0)
    state.commit()
    ema.value += 1.0
    state.restore()
    assert state.ema is ema
    assert torch.equal(ema.value, torch.zeros(3)), "the live object was not restored"
    assert "ema" not in state.values


def test_construction_before_hvd_init_does_not_scale_the_lr(hvd, monkeypatch):
    """Before: a state built before ``hvd.init()`` recorded base world size 1, so
    ``scale_lr`` multiplied the LR by the whole world size at the first sync/reset."""
    from hvd_elastic.training.state import TrainingState

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monkeypatch.setattr(horovod_torch, "is_initialized", lambda: False)
    state = TrainingState(model=model, optimizer=opt, rng=False, batch_policy=BatchPolicy.scale_lr(8))
    # hvd.init() in a world of four, then the first reset
    monkeypatch.setattr(horovod_torch, "is_initialized", lambda: True)
    monkeypatch.setattr(horovod_torch, "size", lambda: 4)
    monkeypatch.setattr(horovod_torch, "rank", lambda: 0)
    state.reset()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1), "the LR was scaled by the world size"
    assert state.snapshot()["policy"]["base_world_size"] in (None, 4)
    state.commit()
    assert state.snapshot()["policy"]["base_world_size"] == 4


@pytest.mark.parametrize("call, message", [
    (lambda s: s.record_batch(0, 32), "ElasticSampler"),
    (lambda s: s.record_batch(3, 32), "ElasticSampler"),
    (lambda s: s.record_batch(batch_idx=3, batch_size=32), "ElasticSampler"),
    (lambda s: s.record_batch(0), "positive integer"),
])
def test_a_horovod_style_record_batch_is_refused_with_the_fix(call, message):
    """Before: ``record_batch(0)`` (Horovod's first ``batch_idx``) silently recorded no
    step, and Horovod's ``record_batch(batch_idx, batch_size)`` got Python's bare
    "takes from 1 to 2 positional arguments" with no word of what to call instead."""
    s = ExactlyOnceSampler(64, 4)
    with pytest.raises((TypeError, ValueError), match=message):
        call(s)
    assert s.offset == 0


def test_forgetting_record_batch_fails_at_the_second_commit(hvd):
    """Before: commits without ``record_batch()`` kept the sampler at the start of
    the epoch, so every reset replayed the epoch from its first sample."""
    from hvd_elastic.training.state import TrainingState

    sampler = ExactlyOnceSampler(40, 4)
    state = TrainingState(rng=False, sampler=sampler, step=0)
    loader = DataLoader(list(range(40)), batch_sampler=sampler)
    with pytest.raises(RuntimeError, match="record_batch"):
        for _ in loader:
            state.step += 1
            state.commit()
    assert state.step == 2


def test_commit_at_the_top_of_the_loop_is_not_mistaken_for_a_missing_record(hvd):
    from hvd_elastic.training.state import TrainingState

    sampler = ExactlyOnceSampler(40, 4)
    state = TrainingState(rng=False, sampler=sampler)
    for _ in DataLoader(list(range(40)), batch_sampler=sampler, num_workers=0):
        state.commit()
        sampler.record_batch()
    assert sampler.remaining == 0


def test_forgetting_set_epoch_fails_instead_of_training_on_nothing():
    """Before: without ``set_epoch()`` every epoch after the first was empty and
    the job 'finished' having trained one epoch."""
    s = ExactlyOnceSampler(8, 4)
    for _ in s:
        s.record_batch()
    with pytest.raises(RuntimeError, match="set_epoch"):
        list(s)  # the next epoch of a loop without set_epoch: refused at once, not one empty epoch first
    s.set_epoch(0)
    assert list(s) == []  # after set_epoch (a reset re-entering the epoch) one empty pass is normal
    s.set_epoch(1)
    assert len(list(s)) == 2


def test_the_batch_policy_alone_says_the_batch_size(hvd):
    """Before: ``ExactlyOnceSampler`` required a per-rank ``batch_size`` even when a
    ``BatchPolicy`` overrode it (the example passed the global batch twice)."""
    from hvd_elastic.training.state import TrainingState

    sampler = ExactlyOnceSampler(100)
    TrainingState(rng=False, sampler=sampler, batch_policy=BatchPolicy.constant_global(24))
    assert sampler.step_samples == 24
    alone = ExactlyOnceSampler(100)
    with pytest.raises(ValueError, match="batch_size"):
        iter(alone)


def test_commit_step_is_the_whole_end_of_a_step(hvd):
    """One call instead of three pieces: ``record_batch()``, ``step += 1``, ``commit()``."""
    from hvd_elastic.training.state import TrainingState

    sampler = ExactlyOnceSampler(40, 4)
    state = TrainingState(rng=False, sampler=sampler, step=0)
    for _ in sampler:
        state.commit_step()
    assert (state.step, sampler.remaining, state.commit_count) == (10, 0, 10)
    state.restore()
    assert state.snapshot()["values"]["step"] == 10
