"""The adapter registry: which adapter commits which object, and how users add their own."""

from __future__ import annotations

import pytest
import torch

from hvd_elastic.training import components
from hvd_elastic.training.sampler import ExactlyOnceSampler


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def state_dict(self) -> dict:
        return {"n": self.n}

    def load_state_dict(self, state: dict) -> None:
        self.n = state["n"]


class CountingAdapter(components.StatefulAdapter):
    synced: list[int] = []

    def after_sync(self, rank: int) -> None:
        self.synced.append(rank)


@pytest.fixture
def registry():
    saved = components.get_adapter_registry()
    yield
    components.set_adapter_registry(saved)


def test_defaults_pick_by_type_and_fall_back_to_state_dict():
    assert type(components.adapter_for(torch.nn.Linear(1, 1))) is components.ModuleAdapter
    opt = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)
    assert type(components.adapter_for(opt)) is components.OptimizerAdapter
    assert type(components.adapter_for(ExactlyOnceSampler(4, 1))) is components.SamplerAdapter
    assert type(components.adapter_for(Counter())) is components.StatefulAdapter
    with pytest.raises(TypeError, match="cannot commit object: it needs state_dict"):
        components.adapter_for(object())


def test_a_registered_adapter_wins_and_gets_the_sync_hook(hvd, registry):
    from hvd_elastic.training.state import TrainingState

    components.register_adapter(Counter, CountingAdapter)
    counter = Counter()
    state = TrainingState(rng=False, counter=counter)
    assert type(state._components["counter"]) is CountingAdapter
    counter.n = 5
    state.sync()  # a world of one: this rank is 0
    assert CountingAdapter.synced == [0] and counter.n == 5
    with pytest.raises(TypeError, match="needs a type and a callable"):
        components.register_adapter("Counter", CountingAdapter)
