"""Misusing the training API fails at once, naming the value and what was expected, instead of failing far
from the mistake or training on something else than asked."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from hvd_elastic import BatchPolicy, ExactlyOnceSampler, TrainingState
from hvd_elastic.training.checkpoint import CheckpointManager


@pytest.mark.parametrize("below", ["", "sub/dir"])
def test_a_checkpoint_dir_a_file_is_in_the_way_of_is_a_value_error_naming_it(tmp_path, below):
    blocker = tmp_path / "ckpt"
    blocker.write_text("")
    directory = blocker / below if below else blocker
    with pytest.raises(ValueError) as info:
        CheckpointManager(directory, every_commits=1)
    assert str(info.value) == (f"checkpoint_dir={str(directory)!r} cannot be made a directory: {str(blocker)!r} is a "
                               "file (expected a directory, or a path where one can be made)")


def test_a_batch_policy_that_is_no_batch_policy_is_refused_at_construction():
    with pytest.raises(TypeError) as info:
        TrainingState(model=torch.nn.Linear(2, 1), batch_policy="constant", epoch=0)
    assert str(info.value) == ("batch_policy='constant' is not a BatchPolicy: build one with BatchPolicy."
                               "constant_global(N), BatchPolicy.accumulate(N, M) or BatchPolicy.scale_lr(N)")
    TrainingState(model=torch.nn.Linear(2, 1), batch_policy=BatchPolicy.constant_global(8), epoch=0)  # the fix works


@pytest.mark.parametrize("loader_args", [{}, {"batch_size": 4}, {"batch_size": None}])
def test_the_sampler_given_as_sampler_instead_of_batch_sampler_is_refused(loader_args):
    data = TensorDataset(torch.arange(32.0).unsqueeze(1))
    sampler = ExactlyOnceSampler(data, 8, rank=0, world_size=1)
    with pytest.raises(TypeError, match=r"^ExactlyOnceSampler is a batch sampler: pass it as DataLoader\(dataset, "
                                        r"batch_sampler=sampler, collate_fn=ExactlyOnceSampler.collate\(\)\), not "
                                        r"sampler=sampler$"):
        next(iter(DataLoader(data, sampler=sampler, **loader_args)))
    sampler.set_epoch(0)
    (batch,) = next(iter(DataLoader(data, batch_sampler=sampler, collate_fn=ExactlyOnceSampler.collate())))
    assert batch.shape == (8, 1)  # the right way: one batch of 8 samples, no extra dimension


@pytest.mark.parametrize("batch_size", [1.5, 2.0, True, "8", 0, -1])
def test_a_batch_size_that_is_no_positive_integer_is_refused(batch_size):
    with pytest.raises(ValueError) as info:
        ExactlyOnceSampler(100, batch_size, rank=0, world_size=1)
    assert str(info.value) == f"batch_size must be a positive integer, got {batch_size!r}"
