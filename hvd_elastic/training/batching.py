"""What happens to the batch size and the learning rate when the world is resized.

Three policies, chosen by the user (:class:`TrainingState` applies the chosen
one after every sync and reset):

``BatchPolicy.constant_global(global_batch_size)``
    The global batch stays ``global_batch_size``; the per-rank batch follows
    the world size (``global / world``; when it does not divide, ranks differ
    by one sample).  Optimisation is unchanged by a resize; the per-rank
    memory use grows when ranks leave.

``BatchPolicy.accumulate(global_batch_size, micro_batch_size)``
    The per-rank (micro-)batch stays ``micro_batch_size``; the number of
    gradient-accumulation passes per optimizer step follows the world size:
    ``round(global / (micro * world))``, at least 1.  The effective global
    batch is ``passes * micro * world`` (exactly ``global_batch_size`` when
    it divides).  ``state.accumulation_steps`` gives the passes, and a
    Horovod ``DistributedOptimizer`` is told via ``set_backward_passes_per_step``.

``BatchPolicy.scale_lr(batch_size, base_world_size=None)``
    The per-rank batch stays ``batch_size``, so the global batch is
    ``batch_size * world``; the learning rate is scaled linearly by
    ``world / base_world_size`` (Goyal et al., 2017).  ``base_world_size``
    defaults to the world size when training first started (recorded in the
    committed state, so it survives resets and restarts).  The scale is
    applied to every param group's ``lr`` and ``initial_lr`` and to each LR
    scheduler's ``base_lrs``; schedulers that keep other absolute LR values
    (``OneCycleLR``, ``CyclicLR``) need a reset callback of their own.

:func:`fit_to_world` applies a policy to the live objects; ``TrainingState``
calls it after construction and every sync and reset.
"""

from __future__ import annotations

from typing import Any, Sequence


class BatchPolicy:
    """A resize policy; build one with the class methods above."""

    CONSTANT_GLOBAL = "constant_global"
    ACCUMULATE = "accumulate"
    SCALE_LR = "scale_lr"
    MODES = (CONSTANT_GLOBAL, ACCUMULATE, SCALE_LR)

    def __init__(
        self,
        mode: str,
        *,
        global_batch_size: int | None = None,
        batch_size: int | None = None,
        base_world_size: int | None = None,
    ):
        if mode not in self.MODES:
            raise ValueError(f"unknown batch policy mode {mode!r}; expected one of {', '.join(self.MODES)}")
        needs_global = mode in (self.CONSTANT_GLOBAL, self.ACCUMULATE)
        needs_local = mode in (self.ACCUMULATE, self.SCALE_LR)
        if needs_global:
            _check_positive("global_batch_size", global_batch_size)
        if needs_local:
            _check_positive("batch_size", batch_size)
        if base_world_size is not None:
            _check_positive("base_world_size", base_world_size)
        self.mode = mode
        self.global_batch_size = global_batch_size
        self.batch_size = batch_size
        self.base_world_size = base_world_size

    @classmethod
    def constant_global(cls, global_batch_size: int) -> "BatchPolicy":
        """Keep the global batch at ``global_batch_size`` samples per step; the per-rank batch follows the world.

        Each rank takes ``global_batch_size / world`` samples (ranks differ by one when it does not
        divide), so optimisation is unchanged by a resize and per-rank memory grows when ranks leave.
        """
        return cls(cls.CONSTANT_GLOBAL, global_batch_size=global_batch_size)

    @classmethod
    def accumulate(cls, global_batch_size: int, micro_batch_size: int) -> "BatchPolicy":
        """Keep the per-rank batch at ``micro_batch_size``; gradient-accumulation passes follow the world.

        Passes per optimizer step: ``round(global_batch_size / (micro_batch_size * world))``, at least 1,
        given by ``state.accumulation_steps`` and told to a Horovod ``DistributedOptimizer`` through
        ``set_backward_passes_per_step``.  The effective global batch is ``passes * micro * world``.
        """
        return cls(cls.ACCUMULATE, global_batch_size=global_batch_size, batch_size=micro_batch_size)

    @classmethod
    def scale_lr(cls, batch_size: int, base_world_size: int | None = None) -> "BatchPolicy":
        """Keep the per-rank batch at ``batch_size`` and scale the learning rate by ``world / base_world_size``.

        ``base_world_size`` defaults to the world size when training first started (committed with the
        state, so it survives resets and restarts).  The scale is applied to every param group's ``lr``
        and ``initial_lr`` and to each LR scheduler's ``base_lrs``.
        """
        return cls(cls.SCALE_LR, batch_size=batch_size, base_world_size=base_world_size)

    def step_samples(self, world_size: int) -> int:
        """Samples one sampler step (one forward/backward on every rank) takes."""
        _check_positive("world_size", world_size)
        if self.mode == self.CONSTANT_GLOBAL:
            return max(_required("global_batch_size", self.global_batch_size), world_size)
        return _required("batch_size", self.batch_size) * world_size

    def accumulation_steps(self, world_size: int) -> int:
        """Forward/backward passes per optimizer step."""
        _check_positive("world_size", world_size)
        if self.mode != self.ACCUMULATE:
            return 1
        global_batch = _required("global_batch_size", self.global_batch_size)
        return max(1, round(global_batch / (_required("batch_size", self.batch_size) * world_size)))

    def effective_global_batch(self, world_size: int) -> int:
        """Samples per optimizer step across the world."""
        return self.step_samples(world_size) * self.accumulation_steps(world_size)

    def lr_factor(self, world_size: int, base_world_size: int) -> float:
        """Multiplier of the user's learning rate for ``world_size``."""
        _check_positive("world_size", world_size)
        if self.mode != self.SCALE_LR:
            return 1.0
        return world_size / (self.base_world_size or base_world_size)

    def __repr__(self) -> str:
        fields = {"global_batch_size": self.global_batch_size, "batch_size": self.batch_size,
                  "base_world_size": self.base_world_size}
        shown = ", ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
        return f"BatchPolicy({self.mode!r}, {shown})"


def _required(name: str, value: int | None) -> int:
    """``value``, which ``__init__`` checked is set in every mode that reads it."""
    if value is None:
        raise ValueError(f"this BatchPolicy's mode needs {name}, which is None")
    return value


def _check_positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


# -- applying a policy to the live objects -----------------------------------------------------


def new_bookkeeping() -> dict[str, Any]:
    """The policy state a TrainingState commits: the LR scale applied, the base world size."""
    return {"lr_factor": 1.0, "base_world_size": None}


def fit_to_world(policy: BatchPolicy | None, bookkeeping: dict[str, Any], *, rank: int, size: int,
                 initialized: bool, optimizer: Any = None, schedulers: Sequence[Any] = (),
                 sampler: Any = None) -> None:
    """Fit sampler, LR and accumulation to a world of ``size`` (this process is ``rank``); idempotent.

    ``bookkeeping`` (from :func:`new_bookkeeping`, committed with the state so a
    joining rank learns it from rank 0) is updated in place.  The base world
    size is recorded by the first call with ``initialized`` (Horovod is
    initialised), so a state built before ``hvd.init()`` does not take 1 and
    scale the LR by the whole world at its first sync.

    With a policy, the policy alone sets the sampler's step: a sampler that
    also carries a fixed ``batch_size`` (``ExactlyOnceSampler(data, 16)``) is
    refused with ``ValueError`` rather than having that size silently ignored.
    A ``policy`` that is no :class:`BatchPolicy` is a ``TypeError``, raised at
    the state's construction (its first call).
    """
    if policy is not None and not isinstance(policy, BatchPolicy):  # else a str fails commits later, far from here
        raise TypeError(f"batch_policy={policy!r} is not a BatchPolicy: build one with BatchPolicy.constant_global(N), "
                        "BatchPolicy.accumulate(N, M) or BatchPolicy.scale_lr(N)")
    set_world = getattr(sampler, "set_world", None)
    fixed = getattr(sampler, "batch_size", None)
    if policy is not None and set_world is not None and fixed is not None:
        raise ValueError(
            f"{type(sampler).__name__}(batch_size={fixed}) and batch_policy={policy!r} both set the batch, and the "
            f"policy would silently override batch_size: leave batch_size out of the sampler"
        )
    if set_world is not None:
        set_world(rank, size, policy.step_samples(size) if policy is not None else None)
    if policy is None:
        return
    if bookkeeping["base_world_size"] is None and initialized:
        bookkeeping["base_world_size"] = size
    base = bookkeeping["base_world_size"]
    applied = bookkeeping["lr_factor"]
    factor = applied if base is None else policy.lr_factor(size, base)  # no world yet: scale later
    if optimizer is not None and factor != applied:
        scale_lr(optimizer, schedulers, factor / applied)
        bookkeeping["lr_factor"] = factor
    set_passes = getattr(optimizer, "set_backward_passes_per_step", None)
    if set_passes is not None:
        set_passes(policy.accumulation_steps(size))


def scale_lr(optimizer: Any, schedulers: Sequence[Any], ratio: float) -> None:
    """Multiply every param group's ``lr`` and ``initial_lr`` and each scheduler's ``base_lrs`` by ``ratio``."""
    from hvd_elastic.training._internal import compat  # torch and Horovod: only when there is an optimizer

    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * ratio
        if "initial_lr" in group:
            group["initial_lr"] = group["initial_lr"] * ratio
    for scheduler in schedulers:
        if hasattr(scheduler, "base_lrs"):
            scheduler.base_lrs = [lr * ratio for lr in scheduler.base_lrs]
        compat.set_last_lr(scheduler, [g["lr"] for g in optimizer.param_groups])
