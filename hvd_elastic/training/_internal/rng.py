"""Random number generator states as one committable object.

:class:`RNGState` captures the torch CPU generator, every CUDA device's
generator (when CUDA is initialised), NumPy's global generator and Python's
``random``.  Its ``state_dict`` holds only tensors,
ints, floats, strings, tuples, lists and ``None``, so a snapshot containing it
loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as _np  # a requirement of hvd-elastic (setup.cfg), not optional
import torch


class RNGState:
    """``state_dict``/``load_state_dict`` over the process-global generators."""

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "torch": torch.get_rng_state(),
            "python": _python_to_plain(random.getstate()),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = [t.cpu() for t in torch.cuda.get_rng_state_all()]
        kind, keys, pos, has_gauss, cached = _np.random.get_state()
        state["numpy"] = {
            "kind": str(kind),
            "keys": torch.from_numpy(_np.asarray(keys, dtype=_np.int64)),
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
        if numpy_state is not None:
            _np.random.set_state(
                (
                    numpy_state["kind"],
                    numpy_state["keys"].numpy().astype("uint32"),
                    numpy_state["pos"],
                    numpy_state["has_gauss"],
                    numpy_state["cached_gaussian"],
                )
            )


    def fork(self, rank: int) -> None:
        """Reseed every generator from the current torch state and ``rank``.

        After a sync every rank holds rank 0's states; ranks other than 0 call
        this so dropout and augmentation differ between ranks, while the same
        committed state and rank always give the same streams.
        """
        source = torch.get_rng_state().numpy().tobytes() + int(rank).to_bytes(8, "little")
        seed = int.from_bytes(hashlib.blake2b(source, digest_size=8).digest(), "little") >> 1  # 63 bits
        torch.manual_seed(seed)  # the CPU and every CUDA device
        random.seed(seed)
        _np.random.seed(seed % 2**32)


def _python_to_plain(state: tuple) -> list:
    version, internal, gauss_next = state
    return [version, list(internal), gauss_next]


def _plain_to_python(plain: list) -> tuple:
    version, internal, gauss_next = plain
    return (version, tuple(internal), gauss_next)
