"""The environment of a process that the demo (or the test bed on top of it) starts, and where its programs are."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

#: The virtual environment's bin folder: horovodrun, hvd-elastic and python come from here.
VENV_BIN = Path(sys.executable).parent
#: The project's command (node agent, drain, status, consul-dev, ...).
HVD_ELASTIC = VENV_BIN / "hvd-elastic"
# A checkout (an editable install) runs its own discovery/consul_hosts, so an edit there is what runs;
# for an installed package this is site-packages, which has no discovery/.
_CHECKOUT_SCRIPT = Path(__file__).resolve().parents[2] / "discovery" / "consul_hosts"
#: What ``horovodrun --host-discovery-script`` runs to ask Consul for hosts: the checkout's
#: script, or (an installed package, no checkout) the copy installed next to hvd-elastic.
CONSUL_HOSTS = next((p for p in (_CHECKOUT_SCRIPT, VENV_BIN / "consul_hosts") if p.exists()), _CHECKOUT_SCRIPT)

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
    every host by name) and output is unbuffered so logs are complete when a
    process is killed.  ``PYTHONPATH`` is left as ``base`` has it: the children
    import the installed hvd_elastic, wherever the command runs from (the test
    bed, testbed/env.py, adds its checkout).  ``discovery_state`` becomes
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
