"""Keep the Consul ACL token off other users' screens: the check discovery and the doctor run.

horovodrun copies its WHOLE environment onto the ssh command line of every
remote worker (``ssh host 'cd ... ; env VAR=value ... python train.py'``,
``horovod/runner/gloo_run.py``), where ``ps`` shows it to every user of that
host, and it prints its ``--host-discovery-script`` command, ``--token VALUE``
included, when a discovery call fails (besides showing it in the launch host's
process list).  Discovery needs the token, and the workers' health cut
(:mod:`hvd_elastic.training._internal.health_cut`) reads it from the same file on its own
host.  A token FILE is safe: only its path travels.

So discovery running under horovodrun with a token value in
``CONSUL_HTTP_TOKEN`` or a ``--token`` flag refuses (exit 2, one line naming
the risk and the fix) unless ``HVD_ELASTIC_ALLOW_EXPOSED_TOKEN=1`` accepts the
risk.  A job's first call always gets here (no host cache exists yet), so a
refused job stops before it starts a worker.  ``hvd-elastic doctor`` reports
the same finding wherever it runs.

Import-light (``os`` plus modules discovery loads anyway): the full discovery
path runs this.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from hvd_elastic.envvars import ConfigError, env_bool
from hvd_elastic.discovery import jobdir

ALLOW_ENV = "HVD_ELASTIC_ALLOW_EXPOSED_TOKEN"
_FILE_FIX = "a file holding the token that only you can read (chmod 600; see discovery/README.md)"
MAX_ANCESTORS = 64  # a launcher's process tree is a handful deep; bounds the walk on an odd /proc


def exposure(environ: Mapping[str, str], token_flag: bool) -> tuple[str, str] | None:
    """(risk, fix) when the token is given in a way horovodrun shows to others, else None."""
    if environ.get("CONSUL_HTTP_TOKEN"):
        return ("CONSUL_HTTP_TOKEN holds the Consul ACL token and horovodrun copies its whole environment onto "
                "every remote worker's ssh command line, where any user of those hosts can read it",
                f"unset CONSUL_HTTP_TOKEN and set CONSUL_HTTP_TOKEN_FILE to {_FILE_FIX}")
    if token_flag:
        return ("--token puts the Consul ACL token on horovodrun's command line, which any user of the launch "
                "host can read and horovodrun prints when discovery fails",
                f"replace --token by --token-file or CONSUL_HTTP_TOKEN_FILE naming {_FILE_FIX}")
    return None


def allowed(environ: Mapping[str, str]) -> bool:
    """True when ``HVD_ELASTIC_ALLOW_EXPOSED_TOKEN`` accepts the risk; raises ConfigError on a non-boolean."""
    return env_bool(ALLOW_ENV, False, environ)


def under_horovodrun() -> bool:
    """True when a process above this one runs horovodrun (False where ``/proc`` cannot tell).

    Every ancestor is looked at, not only the job process of :mod:`.jobdir`
    (the parent of our session leader): a wrapper that starts its own session
    must not hide horovodrun.
    """
    pid = os.getppid()
    for _ in range(MAX_ANCESTORS):
        if pid <= 1:
            return False
        if jobdir.is_horovodrun(pid):
            return True
        try:
            pid = jobdir.proc_stat(pid)[0]
        except (OSError, ValueError, IndexError):
            return False
    return False


def check_discovery(token_flag: bool, environ: Mapping[str, str] | None = None) -> None:
    """Raise ConfigError (discovery's exit 2) for an exposed token under horovodrun without the opt-in."""
    env = os.environ if environ is None else environ
    found = exposure(env, token_flag)
    if found is not None and not allowed(env) and under_horovodrun():
        risk, fix = found
        raise ConfigError(f"refusing to run under horovodrun: {risk}; {fix}, or set {ALLOW_ENV}=1 to accept the risk")
