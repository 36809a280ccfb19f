"""Settings read from the environment: booleans and durations, read one way everywhere.

Dependency-free and cheap to import: discovery (run every second under
``python -I -S``), training and the dev agent all read their variables
through here.  A value that is set but unusable is a :class:`ConfigError`
whose message names the variable, the value and what was expected; an
unset or empty variable is its default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from hvd_elastic.errors import HvdElasticError

# Go's strconv.ParseBool, which Consul's own CONSUL_HTTP_* variables go through.
TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


class ConfigError(HvdElasticError, ValueError):
    """A configuration value is invalid; the message names the value and what was expected."""


def parse_bool(name: str, value: str) -> bool:
    """Parse a boolean the way Go's ``strconv.ParseBool`` (and so Consul) does."""
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise ConfigError(f"{name}={value!r} is not a boolean (expected one of 1, t, true, 0, f, false)")


def env_bool(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """Variable ``name`` as :func:`parse_bool` reads it, ``default`` when unset or empty."""
    value = (os.environ if environ is None else environ).get(name, "")
    return parse_bool(name, value) if value else default


#: What a duration setting takes, for error messages: the spellings :func:`parse_seconds` accepts.
DURATION = "seconds, or e.g. 500ms, 15s, 1m30s"


def parse_seconds(text: str) -> float:
    """Seconds from a bare number (``"1.5"``) or a Go duration as Consul writes them (``"15s"``, ``"1m30s"``,
    ``"500ms"``); ValueError otherwise.

    The one reading of every duration setting, flags and variables alike, so that an operator can copy
    Consul's own spelling anywhere and a bare number keeps meaning seconds.
    """
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    # Only here: a bare number, the common case, never imports re.
    from hvd_elastic.gotypes import SECOND, parse_duration

    return parse_duration(text) / SECOND


def env_seconds(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """Variable ``name`` as a finite duration >= 0 in seconds (:func:`parse_seconds`), ``default`` when unset or
    empty."""
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if not raw:
        return default
    try:
        value = parse_seconds(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise ConfigError(f"{name}={raw!r} is not a duration >= 0 ({DURATION})")
    return value


def horovod_hostname() -> str:
    """This rank's host as horovodrun names it (its host file or discovery line); '' outside horovodrun.

    horovodrun sets ``HOROVOD_HOSTNAME`` for its workers: a coupling listed in
    :mod:`hvd_elastic.training._internal.compat`, read here and nowhere else.
    """
    return os.environ.get("HOROVOD_HOSTNAME", "")
