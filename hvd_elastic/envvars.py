"""Settings read from the environment: booleans and durations, read one way everywhere.

Dependency-free and cheap to import: discovery (run every second under
``python -I -S``), training and the dev agent all read their variables
through here.  A value that is set but unusable is a :class:`ConfigError`
whose message names the variable, the value and what was expected; an
unset or empty variable is its default.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from hvd_elastic.errors import HvdElasticError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: discovery imports this module on its every-second path
if TYPE_CHECKING:
    from typing import Any

#: Consul's service name of the training nodes, unless ``HVD_ELASTIC_SERVICE`` (or a ``--service`` flag) says.
SERVICE_ENV, DEFAULT_SERVICE = "HVD_ELASTIC_SERVICE", "horovod"
DATACENTER_ENV = "HVD_ELASTIC_DATACENTER"  # the datacenter to query; unset: the agent's

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


class Check:
    """A setting's type, for a flag and a variable alike: ``convert(text)`` (ValueError or None: refused),
    kept only if ``accept(value)``; ``expected`` says what a refused text should have been.

    :mod:`hvd_elastic.options` turns one into an argparse ``type=``; :meth:`read` reads a variable with it.
    """

    __slots__ = ("convert", "accept", "expected")

    def __init__(self, convert: Callable[[str], Any], accept: Callable[[Any], bool], expected: str):
        self.convert, self.accept, self.expected = convert, accept, expected

    def parse(self, text: str) -> Any:
        """The value of ``text``; ValueError ``'TEXT' is not EXPECTED`` when refused."""
        try:
            value = self.convert(text)
        except ValueError:
            value = None
        if value is None or not self.accept(value):
            raise ValueError(f"{text!r} is not {self.expected}")
        return value

    def read(self, name: str, default: str | None = None, environ: Mapping[str, str] | None = None) -> Any:
        """Variable ``name`` parsed (blank: unset), else ``default`` parsed alike (None: None).  Raises
        ConfigError naming the variable, its value and what was expected."""
        raw = (os.environ if environ is None else environ).get(name, "")
        text = raw if raw.strip() else default
        if text is None:
            return None
        try:
            return self.parse(text)
        except ValueError:
            raise ConfigError(f"{name}={text!r} is not {self.expected}") from None


TEXT = Check(str, lambda _: True, "text")
POSITIVE_INT = Check(int, lambda v: v > 0, "a positive integer")
POSITIVE_NUMBER = Check(float, lambda v: 0 < v < float("inf"), "a positive number")
#: Every duration setting: Consul's spelling (15s, 1m30s, 500ms) or bare seconds, through the one parser.
POSITIVE_SECONDS = Check(parse_seconds, lambda v: 0 < v < float("inf"), f"a positive duration ({DURATION})")
NON_NEGATIVE_SECONDS = Check(parse_seconds, lambda v: 0 <= v < float("inf"), f"a duration >= 0 ({DURATION})")
BOOLEAN = Check(lambda text: parse_bool("", text), lambda _: True, "a boolean (one of 1, t, true, 0, f, false)")


def env_seconds(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """Variable ``name`` as a finite duration >= 0 in seconds (:func:`parse_seconds`), ``default`` when unset or
    empty."""
    value = NON_NEGATIVE_SECONDS.read(name, None, environ)
    return default if value is None else value


def env_list(name: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """A comma-separated variable as a list, blanks dropped."""
    text = (os.environ if environ is None else environ).get(name) or ""
    return [item.strip() for item in text.split(",") if item.strip()]


def setting(args: Any, dest: str, flag: str) -> str:
    """What set ``args.<dest>``, for a message about its value: the variable it was read from (recorded in
    ``args._env_sources`` by whoever read it), else ``flag``."""
    return getattr(args, "_env_sources", {}).get(dest) or flag


def horovod_hostname() -> str:
    """This rank's host as horovodrun names it (its host file or discovery line); '' outside horovodrun.

    horovodrun sets ``HOROVOD_HOSTNAME`` for its workers: a coupling listed in
    :mod:`hvd_elastic.training._internal.compat`, read here and nowhere else.
    """
    return os.environ.get("HOROVOD_HOSTNAME", "")
