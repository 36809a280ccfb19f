"""hvd-elastic: elastic Horovod training for PyTorch, with Consul host discovery.

The training API is exported lazily, so command-line paths that never train
(``hvd-elastic discover`` runs every second under horovodrun) do not import
torch or horovod.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "run": "hvd_elastic.training.runner",
    "TrainingState": "hvd_elastic.training.state",
    "ExactlyOnceSampler": "hvd_elastic.training.sampler",
    "BatchPolicy": "hvd_elastic.training.batching",
    "CheckpointManager": "hvd_elastic.training.checkpoint",
    "EventLog": "hvd_elastic.training.events",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hvd_elastic' has no attribute {name!r}")
