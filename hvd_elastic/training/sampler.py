"""A batch sampler that processes every sample of an epoch exactly once, elastically.

The idea
--------
An epoch is one deterministic permutation of ``range(num_samples)`` (seeded by
``seed + epoch``).  Training walks it in *global steps*: the step that starts
at position ``offset`` takes the next ``step_samples`` indices of the
permutation (the *chunk*) and rank ``r`` of ``W`` gets ``chunk[r::W]``.  So
after any number of completed steps the processed samples are exactly the
prefix ``order[:offset]``, whatever world sizes those steps ran with, and the
sampler's whole state is two integers: ``epoch`` and ``offset``.

A reset (join, graceful leave or crash) only changes how the REMAINING suffix
``order[offset:]`` is cut: the next chunk starts at ``offset`` and is divided
among the new world.  After a crash the state is rolled back to the last
commit, so steps that were processed but not committed are processed again;
after a graceful leave Horovod skips ``sync`` but :class:`TrainingState` still
calls :meth:`set_world` from ``on_reset`` (the gap of Horovod issue #3399).

Only completed steps count: iterating (and a DataLoader's prefetching, with
any ``num_workers``) never moves the position; the training loop calls
:meth:`record_batch` once per completed step, before ``state.commit()``
(``state.commit_step()`` does both).  Forgetting a piece is an error, not a
silent replay: two commits in a row that see batches drawn but no step
recorded raise (see :class:`~hvd_elastic.training.components.SamplerAdapter`),
and so does a pass over an epoch that the previous pass exhausted, with no
:meth:`set_epoch` in between.

Passes, not ``iter()`` calls
----------------------------
A pass over an exhausted epoch yields nothing.  That is normal once after
anything that moved the sampler from outside the loop: :meth:`set_epoch`,
:meth:`load_state_dict` (a restore, a resume from a checkpoint) or
:meth:`set_world` (a reset); a reset or a resume that lands on an epoch's
last commit re-enters the loop exactly so.  A pass right after another pass,
with none of those between, means the loop never calls :meth:`set_epoch`,
and is refused.  A pass begins at the first ``next()`` of an iterator, not at
``iter()``: a ``DataLoader`` with worker processes calls ``iter()`` on its
batch sampler twice per pass (``_BaseDataLoaderIter.__init__`` and
``_MultiProcessingDataLoaderIter._reset``) and draws from the second only.

torchdata's ``StatefulDataLoader`` works too: the sampler's iterators are
stateful, so ``loader.state_dict()`` holds the position after the batches
the loader has yielded and ``loader.load_state_dict()`` resumes there (in
any world size).  Under :class:`TrainingState` the committed position is
still the one :meth:`record_batch` advanced.

The tail, without padding
-------------------------
Nothing is ever repeated to even out ranks.  Every rank of a world yields the
same number of batches (``len(sampler)``), so collectives never deadlock:

* a chunk is cut strided, so per-rank batch sizes within a step differ by at
  most one when ``step_samples`` is not a multiple of ``W``;
* the last chunk of an epoch absorbs a remainder smaller than ``W`` (one
  step of up to ``step_samples + W - 1`` samples) instead of leaving a step
  that some ranks could not take part in;
* only when fewer than ``W`` samples remain in the whole epoch (a reset in
  its last moments) do ranks ``r >= remaining`` get an EMPTY batch for the
  final step.  Wrap the collate function with :meth:`collate` so the
  DataLoader yields ``None`` for it, and run an idle step (for Horovod's
  ``DistributedOptimizer``: ``optimizer.zero_grad(); optimizer.step()``,
  which contributes zero gradients to the allreduce).

Uneven batches and idle ranks weigh every sample equally only with a summed
loss divided by the step's global sample count, :attr:`ExactlyOnceSampler.samples_this_step`,
and ``op=hvd.Sum`` in the ``DistributedOptimizer`` (the examples do so).
"""

from __future__ import annotations

import math
import numbers
import sys
from typing import Any, Callable, Sized

import torch
from torch.utils.data import Sampler

from hvd_elastic.training._internal import comm


class ExactlyOnceSampler(Sampler[list[int]]):
    """Batch sampler (``DataLoader(dataset, batch_sampler=sampler)``; ``sampler=`` is a TypeError) for map-style
    datasets.

    Args:
        data_source: the dataset (anything with ``len``) or its length.
        batch_size: samples per rank per step (a step then takes
            ``batch_size * world_size`` samples).  Leave it out when a
            :class:`~hvd_elastic.training.batching.BatchPolicy` is given to
            :class:`TrainingState`: the policy then sets the step size, and
            ``TrainingState`` refuses a sampler given a ``batch_size`` too.
        shuffle: permute each epoch (seeded by ``seed + epoch``) or walk in order.
        seed: the shuffling seed; must be the same on every rank.
        rank, world_size: initial position in the world; :class:`TrainingState`
            calls :meth:`set_world` on every sync and reset.  Defaults to
            Horovod's rank and size when Horovod is initialised, else
            ``torch.distributed``'s when its process group is (a torchrun
            job), else 0 and 1.
    """

    def __init__(
        self,
        data_source: Sized | int,
        batch_size: int | None = None,
        *,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
    ):
        num_samples = data_source if isinstance(data_source, int) else len(data_source)
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        if batch_size is not None and (not isinstance(batch_size, numbers.Integral) or isinstance(batch_size, bool)
                                       or batch_size < 1):
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.num_samples = int(num_samples)
        self.batch_size = None if batch_size is None else int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.epoch = 0
        self.offset = 0
        if rank is None or world_size is None:
            rank, world_size = comm.world()
        self._step_samples: int | None = None
        self.set_world(rank, world_size)
        self._order_cache: tuple[int, torch.Tensor] | None = None
        #: batches handed out by this sampler's iterators, ever (drawn, not completed)
        self.batches_drawn = 0
        # whether the next pass may find the epoch exhausted (see "Passes" above)
        self._empty_pass_ok = True

    # -- world ---------------------------------------------------------------------------

    def set_world(self, rank: int, world_size: int, step_samples: int | None = None) -> None:
        """Re-partition the rest of the epoch for ``world_size`` ranks.

        ``step_samples`` is the number of samples one global step takes
        (default ``batch_size * world_size``).  Iterators created before this
        call keep the old partition: create a new one (re-enter the loop).
        """
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size) and world_size >= 1, got {rank} of {world_size}")
        if step_samples is not None and step_samples < 1:
            raise ValueError(f"step_samples must be a positive integer, got {step_samples}")
        self.rank = int(rank)
        self.world_size = int(world_size)
        self._step_samples = None if step_samples is None else int(step_samples)
        self._empty_pass_ok = True

    @property
    def step_samples(self) -> int:
        """Samples per global step in the current world."""
        if self._step_samples is not None:
            return self._step_samples
        if self.batch_size is None:
            raise ValueError("ExactlyOnceSampler has no batch_size and no BatchPolicy set its step: pass "
                             "batch_size= (per rank) or give TrainingState a batch_policy=")
        return self.batch_size * self.world_size

    # -- epoch and position --------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning, unless it is already the current one.

        Calling it with the current epoch keeps the position, so the usual
        ``for state.epoch in range(state.epoch, epochs): sampler.set_epoch(state.epoch)``
        resumes mid-epoch after a reset or a restart from a checkpoint.
        """
        self._empty_pass_ok = True
        if epoch != self.epoch:
            self.epoch = int(epoch)
            self.offset = 0

    def order(self, epoch: int | None = None) -> torch.Tensor:
        """The epoch's permutation of sample indices (int64), the same on every rank."""
        epoch = self.epoch if epoch is None else epoch
        if self._order_cache is not None and self._order_cache[0] == epoch:
            return self._order_cache[1]
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + epoch)
            order = torch.randperm(self.num_samples, generator=generator)
        else:
            order = torch.arange(self.num_samples)
        self._order_cache = (epoch, order)
        return order

    def step_size_at(self, offset: int) -> int:
        """Samples taken by the global step starting at ``offset`` (0 at the end of the epoch)."""
        return _step_size(self.num_samples, offset, self.step_samples, self.world_size)

    @property
    def samples_this_step(self) -> int:
        """Samples the step being trained takes across ALL ranks: the loss scale that weighs each sample equally.

        Valid between drawing a step's batch and its :meth:`record_batch` (the
        position is that step's start, whatever the DataLoader prefetched).
        With a summed loss and summed gradients every sample of the step gets
        weight ``1 / samples_this_step``, however unevenly the step is split,
        idle ranks included::

            loss = criterion(model(x), y, reduction="sum") / sampler.samples_this_step
            optimizer = hvd.DistributedOptimizer(..., op=hvd.Sum)

        A mean loss with Horovod's default ``op=hvd.Average`` instead gives a
        rank's samples more weight when its batch is a sample shorter, and an
        idle rank's zero gradient dilutes the step.  Under
        ``BatchPolicy.accumulate`` a sampler step is one of the
        ``state.accumulation_steps`` passes of an optimizer step: divide by
        those too (exact while the passes are equal, i.e. except at an epoch's
        end).  Raises ``RuntimeError`` when the epoch is exhausted (no step
        can be in progress).
        """
        size = self.step_size_at(self.offset)
        if size == 0:
            raise RuntimeError(
                f"samples_this_step read after the end of epoch {self.epoch} ({self.num_samples} samples all "
                f"recorded): no step is in progress; read it between drawing a batch and record_batch()"
            )
        return size

    def record_batch(self, steps: int = 1, batch_size: int | None = None, *, batch_idx: int | None = None) -> None:
        """Mark ``steps`` global steps as completed (call once per step, on every rank).

        Not Horovod's ``ElasticSampler.record_batch(batch_idx, batch_size)``,
        which counts samples: that call (a ``batch_size`` or ``batch_idx``) is
        refused with a TypeError instead of being read as a number of steps.
        """
        if batch_size is not None or batch_idx is not None:
            raise TypeError(
                f"ExactlyOnceSampler.record_batch(steps) counts completed global steps, but got "
                f"batch_idx={steps if batch_idx is None else batch_idx}, batch_size={batch_size} as for "
                f"Horovod's ElasticSampler.record_batch(batch_idx, batch_size): call record_batch() once per step"
            )
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ValueError(f"record_batch(steps): steps must be a positive integer, got {steps!r}")
        for _ in range(steps):
            size = self.step_size_at(self.offset)
            if size == 0:
                raise RuntimeError(
                    f"record_batch() called past the end of epoch {self.epoch} "
                    f"({self.num_samples} samples all recorded); call set_epoch() first"
                )
            self.offset += size

    @property
    def remaining(self) -> int:
        """Samples of the current epoch not yet recorded as processed."""
        return self.num_samples - self.offset

    def processed_indices(self) -> torch.Tensor:
        """Indices of the current epoch recorded as processed (by all ranks together)."""
        return self.order()[: self.offset]

    # -- iteration -----------------------------------------------------------------------

    def __iter__(self) -> "_Batches":
        _refuse_as_plain_sampler(self, sys._getframe(1))
        # The partition is fixed NOW (not at the first next()): prefetching
        # DataLoaders create the iterator and then race ahead of record_batch.
        return _Batches(self)

    def _begin_pass(self, offset: int) -> None:
        """A pass starting at ``offset`` draws its first batch (see "Passes" above)."""
        empty_ok, self._empty_pass_ok = self._empty_pass_ok, False
        if offset >= self.num_samples and not empty_ok:
            raise RuntimeError(
                f"ExactlyOnceSampler: epoch {self.epoch} is exhausted ({self.num_samples} samples recorded) "
                f"and iterated again: call sampler.set_epoch(epoch) at the start of every epoch"
            )

    def __len__(self) -> int:
        """Global steps left in the epoch: the same on every rank."""
        steps, offset = 0, self.offset
        # Closed form for the full steps, then at most two tail steps.
        step = self.step_samples
        full = max(0, (self.num_samples - offset - step - self.world_size) // step)
        steps, offset = full, offset + full * step
        while (size := self.step_size_at(offset)) > 0:
            steps, offset = steps + 1, offset + size
        return steps

    @property
    def local_batch_size(self) -> int:
        """The largest batch this rank receives in a full step."""
        return math.ceil(self.step_samples / self.world_size)

    @staticmethod
    def collate(collate_fn: Callable[[list], Any] | None = None) -> Callable[[list], Any]:
        """Wrap a collate function so an empty batch (idle final step) becomes ``None``."""
        return _NoneForEmpty(collate_fn)

    # -- state ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The position, ``epoch`` and ``offset`` (samples of the epoch recorded as processed), with the
        ``seed``, ``shuffle`` and ``num_samples`` it was taken with."""
        return {
            "epoch": self.epoch,
            "offset": self.offset,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_samples": self.num_samples,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a :meth:`state_dict`'s position, adopting its seed and shuffle; ``ValueError`` when it was
        taken on another dataset size."""
        if int(state["num_samples"]) != self.num_samples:
            raise ValueError(
                f"sampler state is for {state['num_samples']} samples but this dataset has "
                f"{self.num_samples}; the dataset changed since the state was committed"
            )
        offset = int(state["offset"])
        if not 0 <= offset <= self.num_samples:
            raise ValueError(f"sampler offset {offset} outside [0, {self.num_samples}]")
        self.seed = int(state["seed"])
        self.shuffle = bool(state["shuffle"])
        self.epoch = int(state["epoch"])
        self.offset = offset
        self._order_cache = None
        self._empty_pass_ok = True


class _Batches:
    """This rank's batches from the position at creation, with the world of that moment.

    Stateful for torchdata's ``StatefulDataLoader``: its ``state_dict`` is
    the position after the batches drawn so far (the loader snapshots it as
    each batch is yielded), and ``load_state_dict`` moves the sampler there.
    """

    def __init__(self, sampler: ExactlyOnceSampler):
        self.sampler = sampler
        self._begun = False
        self._reset()

    def _reset(self) -> None:
        s = self.sampler
        self.order, self.epoch, self.offset = s.order(), s.epoch, s.offset
        self.rank, self.world, self.step = s.rank, s.world_size, s.step_samples

    def __iter__(self) -> "_Batches":
        return self

    def __next__(self) -> list[int]:
        if not self._begun:
            self._begun = True
            self.sampler._begin_pass(self.offset)
        size = _step_size(len(self.order), self.offset, self.step, self.world)
        if size == 0:
            raise StopIteration
        batch = self.order[self.offset + self.rank : self.offset + size : self.world].tolist()
        self.offset += size
        self.sampler.batches_drawn += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {**self.sampler.state_dict(), "epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)
        self._reset()


def _step_size(num_samples: int, offset: int, step: int, world: int) -> int:
    remaining = num_samples - offset
    if remaining <= 0:
        return 0
    # A remainder too small to give every rank a sample joins the last step.
    if remaining <= step or remaining - step < world:
        return remaining
    return step


class _NoneForEmpty:
    """Picklable collate wrapper (DataLoader workers may be spawned)."""

    def __init__(self, collate_fn: Callable[[list], Any] | None):
        if collate_fn is None:
            from torch.utils.data import default_collate

            collate_fn = default_collate
        self.collate_fn = collate_fn

    def __call__(self, batch: list) -> Any:
        return None if len(batch) == 0 else self.collate_fn(batch)


def _refuse_as_plain_sampler(sampler: ExactlyOnceSampler, caller) -> None:
    """TypeError when a DataLoader iterates this batch sampler as a plain one (``sampler=``).

    Its batches would then be single indices: a batch sampler groups them (the
    default ``batch_size=1``), or, with ``batch_size=None``, the dataset is
    indexed with whole lists, and training runs silently on batches with an
    extra dimension.  ``caller`` is the frame that called ``iter()``: a
    wrapper that keeps this sampler as its ``.sampler`` beside a ``drop_last``
    (torch's and torchdata's ``BatchSampler``), or a DataLoader iterator that does not
    collate; with ``batch_sampler=`` it is the DataLoader's iterator, collating.
    """
    holder = caller.f_locals.get("self")
    wrapper = getattr(holder, "sampler", None) is sampler and hasattr(holder, "drop_last")
    if wrapper or getattr(holder, "_auto_collation", True) is False:
        raise TypeError("ExactlyOnceSampler is a batch sampler: pass it as DataLoader(dataset, batch_sampler=sampler, "
                        "collate_fn=ExactlyOnceSampler.collate()), not sampler=sampler")
