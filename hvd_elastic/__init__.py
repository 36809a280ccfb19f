"""hvd-elastic: elastic Horovod training for PyTorch, with Consul host discovery.

The training API is exported lazily, so command-line paths that never train
(``hvd-elastic discover`` runs every second under horovodrun) do not import
torch or horovod.  ``CheckpointManager`` and ``EventLog`` are not exported:
``run`` owns a job's checkpoints and event log, and a second writer in the same
directory should never be the easy path (they stay in :mod:`hvd_elastic.training`).
The ``TYPE_CHECKING`` block names the same objects for type checkers and IDEs;
keep it and ``_LAZY`` in step (a test checks they match).
"""

from __future__ import annotations

import importlib

# Not typing.TYPE_CHECKING: importing typing costs discovery's warm path (it imports this package) ~30%.
TYPE_CHECKING = False

__version__ = "0.1.0"

_LAZY = {
    "run": "hvd_elastic.training.runner",
    "RunConfig": "hvd_elastic.training.runner",
    "TrainingState": "hvd_elastic.training.state",
    "ExactlyOnceSampler": "hvd_elastic.training.sampler",
    "BatchPolicy": "hvd_elastic.training.batching",
}

if TYPE_CHECKING:  # names for type checkers only: __all__ lists them through _LAZY
    from hvd_elastic.training.batching import BatchPolicy  # noqa: F401
    from hvd_elastic.training.runner import RunConfig, run  # noqa: F401
    from hvd_elastic.training.sampler import ExactlyOnceSampler  # noqa: F401
    from hvd_elastic.training.state import TrainingState  # noqa: F401

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hvd_elastic' has no attribute {name!r}")
