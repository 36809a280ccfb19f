"""The environment of a child process started by the test bed, and where its programs are."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

#: The checkout this package lives in (examples/, discovery/ and tests/ are found from here);
#: for an installed package, the site-packages folder (which has no discovery/).
REPO = Path(__file__).resolve().parents[2]
#: The virtual environment's bin folder: horovodrun, hvd-elastic and python come from here.
VENV_BIN = Path(sys.executable).parent
#: The project's command (node agent, drain, status, consul-dev, ...).
HVD_ELASTIC = VENV_BIN / "hvd-elastic"
#: What ``horovodrun --host-discovery-script`` runs to ask Consul for hosts: the checkout's
#: script, or (an installed package, no checkout) the copy installed next to hvd-elastic.
CONSUL_HOSTS = next((p for p in (REPO / "discovery" / "consul_hosts", VENV_BIN / "consul_hosts") if p.exists()),
                    REPO / "discovery" / "consul_hosts")
#: Open MPI refuses to start as root unless told to; CI runs as root.
MPI_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}

# Settings a developer's shell may carry that must not steer a child silently:
# a test's job talks to the dev agent the test started, not to the user's Consul.
_SCRUBBED_PREFIXES = ("CONSUL_", "HVD_ELASTIC_")
# Dropped even with scrub=False: the bed's and the demo's Consul is a dev agent, never the user's, and
# horovodrun would copy a token onto every worker's command line (hvd_elastic/discovery/token_guard.py).
_TOKEN_VARIABLES = ("CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE")


def child_env(base: Mapping[str, str] | None = None, *, scrub: bool = True, discovery_state: str | Path | None = None,
              **extra: str) -> dict[str, str]:
    """``base`` (default ``os.environ``) without ``CONSUL_*``/``HVD_ELASTIC_*``, plus ``extra``.

    The venv's bin folder comes first on ``PATH`` (horovodrun re-runs ``python`` on
    every host by name), this checkout is on ``PYTHONPATH`` (workers import test
    helpers next to them), and output is unbuffered so logs are complete when a
    process is killed.  ``discovery_state`` becomes
    ``HVD_ELASTIC_DISCOVERY_STATE_DIR``, where ``discovery/consul_hosts`` keeps its
    first-call markers: give each job its own (a private folder, mode 0700, such as
    pytest's ``tmp_path``) so no run writes to or reads the shared default in /tmp.
    ``scrub=False`` keeps the ``CONSUL_*``/``HVD_ELASTIC_*`` settings of ``base``:
    for what a user runs (the demo), whose own settings (a state directory, a log
    level) must reach every child; a Consul token never does.  ``extra`` is applied
    last and wins over all of the above.
    """
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if not (scrub and k.startswith(_SCRUBBED_PREFIXES)) and k not in _TOKEN_VARIABLES}
    env["PATH"] = os.pathsep.join(filter(None, [str(VENV_BIN), env.get("PATH")]))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    if discovery_state is not None:
        env["HVD_ELASTIC_DISCOVERY_STATE_DIR"] = str(discovery_state)
    env.update(extra)
    return env


def fetched_binary_missing(what: str, script: str, *binaries: Path) -> str | None:
    """Why ``binaries`` (put next to the venv's Python by ``scripts/<script>``, from bootstrap) cannot run, or None.

    One line: what ``script`` left in ``<first binary>.unavailable`` when it failed, else where they are missing.
    """
    if all(os.access(binary, os.X_OK) for binary in binaries):
        return None
    note = Path(f"{binaries[0]}.unavailable")
    if note.exists():
        return note.read_text().strip()
    return f"no {what} at {binaries[0]}: scripts/bootstrap.sh fetches it (scripts/{script})"
