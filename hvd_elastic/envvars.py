"""Settings read from the environment: booleans and seconds, read one way everywhere.

Dependency-free and cheap to import: discovery (run every second under
``python -I -S``), training and the dev agent all read their variables
through here.  A value that is set but unusable is a :class:`ConfigError`
whose message names the variable, the value and what was expected; an
unset or empty variable is its default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# Go's strconv.ParseBool, which Consul's own CONSUL_HTTP_* variables go through.
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the value and what was expected."""


def parse_bool(name: str, value: str) -> bool:
    """Parse a boolean the way Go's ``strconv.ParseBool`` (and so Consul) does."""
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={value!r} is not a boolean (expected one of 1, t, true, 0, f, false)")


def env_bool(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """Variable ``name`` as :func:`parse_bool` reads it, ``default`` when unset or empty."""
    value = (os.environ if environ is None else environ).get(name, "")
    return parse_bool(name, value) if value else default


def env_seconds(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """Variable ``name`` as a finite number of seconds >= 0, ``default`` when unset or empty."""
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise ConfigError(f"{name}={raw!r} is not a number of seconds >= 0")
    return value
