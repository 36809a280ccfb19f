"""Component adapters: how each kind of object is committed, restored and synced.

:class:`~hvd_elastic.training.state.TrainingState` holds one :class:`Adapter`
per registered object ("model", "optimizer", "scheduler.0", ...).  Which
adapter an object gets is decided by a registry, like Horovod's
``get_handler_registry``/``set_handler_registry``: the first entry whose type
the object is an instance of wins, entries added by :func:`register_adapter`
come first, and anything else with ``state_dict``/``load_state_dict`` gets
:class:`StatefulAdapter`::

    class EmaAdapter(StatefulAdapter):
        def after_sync(self, rank): ...

    register_adapter(Ema, EmaAdapter)
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from hvd_elastic.training._internal import compat
from hvd_elastic.training._internal.rng import RNGState
from hvd_elastic.training.sampler import ExactlyOnceSampler
from hvd_elastic.training._internal.snapshot import tree_copy

AdapterFactory = Callable[[Any], "Adapter"]


class Adapter:
    """How one live object is committed: the contract every adapter keeps.

    ``tensors()`` lists the live tensors that go into the flat buffer (large,
    copied with ``copy_``); ``meta()`` returns a detached copy of everything
    else (small).  Going back, ``targets(meta)`` names the live tensors a
    committed tensor may be copied into in place (done in batches, and per
    bucket during a sync), and ``load()`` restores the rest: the small state
    and any tensor not in ``done``.
    """

    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        return []

    def meta(self) -> Any:
        raise NotImplementedError

    def targets(self, meta: Any) -> dict[str, torch.Tensor]:
        return {}

    def load(self, tensors: dict[str, torch.Tensor], meta: Any, done: frozenset[str] = frozenset()) -> None:
        raise NotImplementedError

    def before_commit(self) -> None:
        """Raise when the live object is in a state that must not be committed."""

    def after_sync(self, rank: int) -> None:
        """Called on every rank once a sync has loaded rank 0's state."""


class ModuleAdapter(Adapter):
    def __init__(self, module: torch.nn.Module):
        self.module = module
        self._extra_state = has_extra_state(module)

    def tensors(self):
        return [(k, v) for k, v in self.module.state_dict().items() if isinstance(v, torch.Tensor)]

    def meta(self):
        if not self._extra_state:
            return {}
        # Only non-tensor extra state (rare) lives here.
        return {k: tree_copy(v) for k, v in self.module.state_dict().items() if not isinstance(v, torch.Tensor)}

    def targets(self, meta):
        # state_dict() tensors alias the parameters and buffers.
        return dict(self.tensors())

    def load(self, tensors, meta, done=frozenset()):
        live = {k for k, _ in self.tensors()}
        if set(tensors) != live:
            raise ValueError(
                f"model layout differs from the committed one: missing {sorted(set(tensors) - live)[:5]}, "
                f"unexpected {sorted(live - set(tensors))[:5]}"
            )
        rest = {k: v for k, v in tensors.items() if k not in done}
        if rest or meta:
            # load_state_dict copies into the existing parameters in place.
            self.module.load_state_dict({**rest, **tree_copy(meta)}, strict=not done)


class OptimizerAdapter(Adapter):
    """Optimizer state by parameter position, restored in place, created when missing."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def tensors(self):
        named = []
        state = self.optimizer.state
        for i, p in enumerate(self._params()):
            entry = state.get(p)
            if entry:
                for key in sorted(entry):
                    value = entry[key]
                    if isinstance(value, torch.Tensor):
                        named.append((f"{i}.{key}", value))
        return named

    def meta(self):
        params = self._params()
        scalars: dict[int, dict[str, Any]] = {}
        placement: dict[str, str] = {}
        state = self.optimizer.state
        for i, p in enumerate(params):
            entry = state.get(p)
            if not entry:
                continue
            for key, value in entry.items():
                if not isinstance(key, str):
                    raise TypeError(f"optimizer state key {key!r} of parameter {i} is not a string")
                if isinstance(value, torch.Tensor):
                    # Moments live with their parameter; e.g. Adam's "step" stays on the CPU.
                    placement[f"{i}.{key}"] = "param" if value.device == p.device else "cpu"
                else:
                    scalars.setdefault(i, {})[key] = tree_copy(value)
        groups = [{k: tree_copy(v) for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        sizes = [len(g["params"]) for g in self.optimizer.param_groups]
        return {"param_groups": groups, "group_sizes": sizes, "scalars": scalars, "placement": placement}

    def targets(self, meta):
        found = {}
        state = self.optimizer.state
        for i, p in enumerate(self._params()):
            for name, value in (state.get(p) or {}).items():
                key = f"{i}.{name}"
                if isinstance(value, torch.Tensor) and value.device == _placement(meta, key, p):
                    found[key] = value
        return found

    def load(self, tensors, meta, done=frozenset()):
        sizes = [len(g["params"]) for g in self.optimizer.param_groups]
        if sizes != list(meta["group_sizes"]):
            raise ValueError(
                f"optimizer has param groups of sizes {sizes} but the committed state has {list(meta['group_sizes'])}"
            )
        per_param: dict[int, dict[str, torch.Tensor]] = {}
        for key, tensor in tensors.items():
            index, _, name = key.partition(".")
            per_param.setdefault(int(index), {})[name] = tensor
        scalars = {int(i): v for i, v in meta["scalars"].items()}
        state = self.optimizer.state
        with torch.no_grad():
            for i, p in enumerate(self._params()):
                want = per_param.get(i, {})
                want_scalars = scalars.get(i, {})
                if not want and not want_scalars:
                    state.pop(p, None)
                    continue
                live = state.get(p) or {}
                entry: dict[str, Any] = {}
                for name, saved in want.items():
                    device = _placement(meta, f"{i}.{name}", p)
                    current = live.get(name)
                    if f"{i}.{name}" in done:
                        entry[name] = current  # already copied in place
                    elif (isinstance(current, torch.Tensor) and current.shape == saved.shape
                            and current.dtype == saved.dtype and current.device == device):
                        current.copy_(saved)
                        entry[name] = current
                    else:
                        # A rank that never stepped gets its state created here:
                        # no dummy optimizer.step(), parameters untouched.
                        entry[name] = saved.to(device=device, copy=True)
                entry.update(tree_copy(want_scalars))
                state[p] = entry
        for group, saved in zip(self.optimizer.param_groups, meta["param_groups"]):
            group.update(tree_copy(saved))
        compat.forget_pending_allreduces(self.optimizer)


def _placement(meta: dict[str, Any], key: str, param: torch.Tensor) -> torch.device:
    return param.device if meta["placement"].get(key) == "param" else torch.device("cpu")


class StatefulAdapter(Adapter):
    """Anything with ``state_dict``/``load_state_dict`` whose state is small."""

    def __init__(self, obj: Any):
        self.obj = obj

    def meta(self):
        return tree_copy(self.obj.state_dict())

    def load(self, tensors, meta, done=frozenset()):
        if not meta and getattr(self.obj, "is_enabled", None) is not None and not self.obj.is_enabled():
            return  # a disabled GradScaler has an empty state and refuses to load it
        # A fresh copy: load_state_dict implementations often keep references.
        self.obj.load_state_dict(tree_copy(meta))


class SamplerAdapter(StatefulAdapter):
    """An :class:`ExactlyOnceSampler`: refuses a commit loop that forgot ``record_batch()``."""

    def __init__(self, obj: Any):
        super().__init__(obj)
        self._seen()

    def _seen(self) -> None:
        self._position = (self.obj.epoch, self.obj.offset)
        self._drawn = self.obj.batches_drawn
        self._stalls = 0

    def before_commit(self) -> None:
        # Batches drawn but the position unchanged since the last commit: a
        # commit at the top of the loop does that once; twice in a row means
        # no step is ever recorded, and every reset would replay the epoch.
        s = self.obj
        stalled = (s.epoch, s.offset) == self._position and s.batches_drawn > self._drawn
        self._stalls = self._stalls + 1 if stalled else 0
        if self._stalls >= 2:
            raise RuntimeError(
                f"ExactlyOnceSampler: {self._stalls} commits in a row saw batches drawn but no step recorded "
                f"(epoch {s.epoch}, offset {s.offset}): call sampler.record_batch() once per completed step "
                f"before state.commit(), or end each step with state.commit_step()"
            )
        self._position, self._drawn = (s.epoch, s.offset), s.batches_drawn

    def load(self, tensors, meta, done=frozenset()):
        super().load(tensors, meta, done)
        self._seen()


class RNGAdapter(StatefulAdapter):
    """RNG states: after a sync, each rank but 0 continues a stream of its own."""

    def after_sync(self, rank: int) -> None:
        if rank != 0:
            self.obj.fork(rank)


def is_stateful(obj: Any) -> bool:
    """Whether ``obj`` has callable ``state_dict`` and ``load_state_dict``."""
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def has_extra_state(module: torch.nn.Module) -> bool:
    base = torch.nn.Module.get_extra_state
    return any(type(m).get_extra_state is not base for m in module.modules())


# -- the registry ------------------------------------------------------------------------------

_DEFAULTS: list[tuple[type, AdapterFactory]] = [
    (torch.nn.Module, ModuleAdapter),
    (torch.optim.Optimizer, OptimizerAdapter),
    (ExactlyOnceSampler, SamplerAdapter),
    (RNGState, RNGAdapter),
]
_registry: list[tuple[type, AdapterFactory]] = list(_DEFAULTS)


def register_adapter(kind: type, factory: AdapterFactory) -> None:
    """Commit instances of ``kind`` (subclasses too) with ``factory(obj)`` from now on.

    Takes precedence over every entry registered before it, the defaults included.
    """
    if not isinstance(kind, type) or not callable(factory):
        raise TypeError(f"register_adapter(kind, factory) needs a type and a callable, got {kind!r}, {factory!r}")
    _registry.insert(0, (kind, factory))


def get_adapter_registry() -> list[tuple[type, AdapterFactory]]:
    """The registry, first match first (a copy)."""
    return list(_registry)


def set_adapter_registry(registry: list[tuple[type, AdapterFactory]]) -> None:
    """Replace the registry (``get_adapter_registry()`` to start from the current one)."""
    _registry[:] = list(registry)


def adapter_for(obj: Any) -> Adapter:
    """The adapter of ``obj``: the first registry match, else :class:`StatefulAdapter`."""
    for kind, factory in _registry:
        if isinstance(obj, kind):
            return factory(obj)
    if is_stateful(obj):
        return StatefulAdapter(obj)
    raise TypeError(f"cannot commit {type(obj).__name__}: it needs state_dict() and load_state_dict(), "
                    f"or an adapter registered with register_adapter()")
