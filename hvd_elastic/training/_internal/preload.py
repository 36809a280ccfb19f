"""What a training script would import after ``hvd.init()``, imported with the training library instead.

A worker that joins a running job is the one process the others wait for.
With join-ahead the survivors train on until the newcomer's ``hvd.init()``
forms the new world; from then on they wait in its first collective for
whatever the newcomer's script does in between.  In a PyTorch script that is
mostly building the optimizer, and the first optimizer imports
``torch._dynamo``: torch wraps ``Optimizer.add_param_group`` in
``torch._disable_dynamo``, which imports it on its first call.  That import is
most of a joining worker's time between ``hvd.init()`` and its first
collective (``benchmarks/README.md``).  Scripts import the training library at
their top, before ``hvd.init()``: imported here, it is paid while the
survivors still train.  Every process pays it once either way.

Contract: importing this module imports ``torch._dynamo`` (torch 2.1 and
later have it).  A failure of that import is logged at debug level and left
for torch to raise where it would have; it never fails this import.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

try:
    import torch._dynamo  # noqa: F401 -- the import is the point
except Exception as exc:  # noqa: BLE001 -- torch raises it again, at the first optimizer, if it matters
    log.debug("could not import torch._dynamo ahead of hvd.init(): %s", exc)
