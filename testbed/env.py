"""The environment of a child process the test bed starts: the product's, with this checkout importable."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from hvd_elastic.local import env as _local
from hvd_elastic.local.env import CONSUL_HOSTS, HVD_ELASTIC, VENV_BIN, fetched_binary_missing

__all__ = ["CONSUL_HOSTS", "HVD_ELASTIC", "MPI_ROOT_ENV", "REPO", "VENV_BIN", "child_env", "fetched_binary_missing"]

#: The checkout (examples/, discovery/, scripts/ and tests/ are found from here).
REPO = Path(__file__).resolve().parents[1]
#: Open MPI refuses to start as root unless told to; CI runs as root.
MPI_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def child_env(base: Mapping[str, str] | None = None, *, scrub: bool = True, discovery_state: str | Path | None = None,
              **extra: str) -> dict[str, str]:
    """:func:`hvd_elastic.local.env.child_env`, with this checkout first on ``PYTHONPATH``.

    The test bed is not installed: the workers and helpers a test starts (``python -m
    testbed.worker``, on a netns host over ssh too) import it from the checkout.
    ``extra`` still wins over everything, ``PYTHONPATH`` included.
    """
    env = _local.child_env(base, scrub=scrub, discovery_state=discovery_state)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env
