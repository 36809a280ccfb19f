"""The snapshot format: what a committed :class:`TrainingState` looks like on the outside.

A snapshot is a nested dict of CPU tensors and plain Python values::

    {"format": SNAPSHOT_FORMAT, "commit_count": int,
     "values": {user values}, "policy": {"lr_factor", "base_world_size"},
     "components": {name: {"tensors": {key: tensor}, "meta": small state}}}

Contract: everything in it is a type ``torch.load(weights_only=True)`` reads
back (:func:`check_loadable` says which value is not, and where), so a
checkpoint of it can never run code and never fails only at resume.
"""

from __future__ import annotations

import copy
from collections import Counter, OrderedDict
from typing import Any

import torch

#: Format tag of snapshot dicts.
SNAPSHOT_FORMAT = "hvd_elastic.training_state/1"

# What torch's weights_only unpickler accepts without add_safe_globals
# (torch/_weights_only_unpickler.py: _get_allowed_globals, plus the builtins).
_SCALARS = frozenset({int, float, bool, str, bytes, bytearray, complex, type(None), torch.dtype, torch.device})
_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter, torch.Size})
_MAPPINGS = frozenset({dict, OrderedDict, Counter})
_SEQUENCES = frozenset({list, tuple, set})
_LEAVES = _SCALARS | _TENSORS


def check_loadable(value: Any, where: str) -> None:
    """Raise TypeError naming the first value under ``where`` that
    ``torch.load(weights_only=True)`` would refuse (its path, repr and type, and the fix)."""
    trail = _first_unloadable(value)
    if trail is None:
        return
    # The path is spelled only on failure: a commit checks its values every time.
    path, bad = where, value
    for fmt, step in reversed(trail):
        bad = step if fmt is _KEY else bad[step] if fmt is _ITEM else list(bad)[step]
        path += f" key {step!r}" if fmt is _KEY else f"[{step!r}]"
    kind = f"{type(bad).__module__}.{type(bad).__qualname__}"
    shown = repr(bad).replace("\n", " ")
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    fix = (f"convert it ({'torch.from_numpy(x)' if type(bad).__name__ == 'ndarray' else 'x.item()'})"
           if type(bad).__module__ == "numpy" else
           f"allow the type with torch.serialization.add_safe_globals([{kind}])")
    raise TypeError(
        f"{path} = {shown} (type {kind}) cannot be checkpointed: torch.load(weights_only=True) would refuse it "
        f"at resume; store plain values (tensors, numbers, strings, lists, tuples, dicts) or {fix}"
    )


# How a trail step descends: into a mapping's key, a mapping's value, or a sequence's i-th item.
_KEY, _ITEM, _INDEX = "key", "item", "index"


def _first_unloadable(value: Any) -> list[tuple[str, Any]] | None:
    """None when ``value`` loads; else the steps down to the refused value, innermost first."""
    kind = type(value)
    if kind in _LEAVES:
        return None
    # Leaves are tested inline: no call per number or string of a long list.
    if kind in _MAPPINGS:
        for key, item in value.items():
            trail = None if type(key) in _LEAVES else _first_unloadable(key)
            if trail is not None:
                return [*trail, (_KEY, key)]
            trail = None if type(item) in _LEAVES else _first_unloadable(item)
            if trail is not None:
                return [*trail, (_ITEM, key)]
        return None
    if kind in _SEQUENCES:
        for i, item in enumerate(value):
            trail = None if type(item) in _LEAVES else _first_unloadable(item)
            if trail is not None:
                return [*trail, (_INDEX, i)]
        return None
    return None if kind in _safe_globals() else []


def _safe_globals() -> set:
    # Entries are types, functions or (object, name) pairs (torch.serialization docs).
    return {g[0] if isinstance(g, tuple) else g for g in torch.serialization.get_safe_globals()}


_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), torch.dtype, torch.device)


def tree_copy(value: Any) -> Any:
    """Copy of a small nested state: containers rebuilt, tensors cloned to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, _IMMUTABLE):
        return value
    if isinstance(value, dict):
        copied = {k: tree_copy(v) for k, v in value.items()}
        return copied if type(value) is dict else type(value)(copied)
    if isinstance(value, list):
        return [tree_copy(v) for v in value]
    if isinstance(value, tuple) and type(value) is tuple:
        return tuple(tree_copy(v) for v in value)
    return copy.deepcopy(value)
