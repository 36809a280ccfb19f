"""Random number generator states as one committable object.

:class:`RNGState` captures the torch CPU generator, every CUDA device's
generator (when CUDA is initialised), NumPy's global generator (when NumPy is
installed) and Python's ``random``.  Its ``state_dict`` holds only tensors,
ints, floats, strings, tuples, lists and ``None``, so a snapshot containing it
loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import random
from typing import Any

import torch

try:  # NumPy is optional: torch does not require it.
    import numpy as _np
except ImportError:  # pragma: no cover - depends on the environment
    _np = None


class RNGState:
    """``state_dict``/``load_state_dict`` over the process-global generators."""

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "torch": torch.get_rng_state(),
            "python": _python_to_plain(random.getstate()),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = [t.cpu() for t in torch.cuda.get_rng_state_all()]
        if _np is not None:
            kind, keys, pos, has_gauss, cached = _np.random.get_state()
            state["numpy"] = {
                "kind": str(kind),
                "keys": torch.from_numpy(keys.astype("int64")),
                "pos": int(pos),
                "has_gauss": int(has_gauss),
                "cached_gaussian": float(cached),
            }
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"].clone())
        random.setstate(_plain_to_python(state["python"]))
        cuda = state.get("cuda")
        if cuda and torch.cuda.is_available():
            # A rank may see fewer devices than the rank that committed: set what exists.
            for device, rng in enumerate(cuda[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(rng.clone(), device)
        numpy_state = state.get("numpy")
        if numpy_state is not None and _np is not None:
            _np.random.set_state(
                (
                    numpy_state["kind"],
                    numpy_state["keys"].numpy().astype("uint32"),
                    numpy_state["pos"],
                    numpy_state["has_gauss"],
                    numpy_state["cached_gaussian"],
                )
            )


def _python_to_plain(state: tuple) -> list:
    version, internal, gauss_next = state
    return [version, list(internal), gauss_next]


def _plain_to_python(plain: list) -> tuple:
    version, internal, gauss_next = plain
    return (version, tuple(internal), gauss_next)
