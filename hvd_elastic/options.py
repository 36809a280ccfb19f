"""Command-line helpers every hvd-elastic command uses: argument types, env defaults, Consul flags, errors, signals.

Library code takes typed values (:class:`ConsulConfig`, dataclasses of its
own); only command modules see argparse namespaces, and they turn them into
typed values with the helpers here.

Consul connection flags carry the names of the ``consul`` CLI's own flags
(``--http-addr``, ``--token``, ``--token-file``, ``--ca-file``,
``--client-cert``, ``--client-key``, ``--datacenter``); each falls back to the
matching ``CONSUL_*`` variable through :meth:`ConsulConfig.from_env`, and a
flag always wins over the environment.  hvd-elastic's own settings fall back
to ``HVD_ELASTIC_*`` variables, so horovodrun's ``--host-discovery-script``
can stay a bare path.
"""

from __future__ import annotations

import argparse
import os
import sys

from hvd_elastic.consul.config import ConsulConfig
from hvd_elastic.envvars import (
    BOOLEAN,
    DATACENTER_ENV,
    DEFAULT_SERVICE,
    NON_NEGATIVE_SECONDS,
    POSITIVE_INT,
    POSITIVE_NUMBER,
    POSITIVE_SECONDS,
    SERVICE_ENV,
    Check,
    ConfigError,
    env_list,
    setting,
)
from hvd_elastic.consul.errors import ConsulError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: discovery's full path imports this module
if TYPE_CHECKING:
    import contextlib
    import logging
    import threading
    from collections.abc import Iterator


class EnvValue(str):
    """A flag's default read from the variable ``variable``: errors about it name the variable, not the flag."""

    variable: str

    def __new__(cls, text: str, variable: str = "") -> EnvValue:  # variable optional: copies and pickles work
        value = super().__new__(cls, text)
        value.variable = variable
        return value


def env(name: str, default: str | None = None) -> str | None:
    """``os.environ[name]`` when set and not blank (an :class:`EnvValue` naming it), else ``default``: blank
    is unset, as for :meth:`~hvd_elastic.envvars.Check.read`."""
    value = os.environ.get(name, "")
    return EnvValue(value, name) if value.strip() else default


def argparse_type(check: Check):
    """An argparse ``type=`` from a setting's :class:`~hvd_elastic.envvars.Check`."""

    def parse(text: str):
        try:
            return check.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = check.expected
    return parse


def argument_type(convert, accept, expected: str):
    """An argparse ``type=``: ``convert(text)``, rejected unless ``accept(value)``."""
    return argparse_type(Check(convert, accept, expected))


positive_int = argparse_type(POSITIVE_INT)
positive_number = argparse_type(POSITIVE_NUMBER)
positive_seconds = argparse_type(POSITIVE_SECONDS)
non_negative_seconds = argparse_type(NON_NEGATIVE_SECONDS)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
log_level = argument_type(str.upper, lambda v: v in LOG_LEVELS, f"a log level ({', '.join(LOG_LEVELS)})")
boolean = argparse_type(BOOLEAN)


def host_list(text: str) -> list[str]:
    """An argparse ``type=``: comma-separated host names, each one a name ssh may be handed.

    The same rule as discovery's (:func:`hvd_elastic.hostnames.is_valid_host`:
    an RFC 1123 name or a dotted IPv4 address); the first bad entry is named, never repaired.
    """
    from hvd_elastic.hostnames import is_valid_host  # here: discovery's fast path never parses a host list

    hosts = [item.strip() for item in text.split(",")]
    if not any(hosts):
        raise argparse.ArgumentTypeError(f"{text!r} names no host")
    for host in hosts:
        if not is_valid_host(host):
            raise argparse.ArgumentTypeError(f"{host!r} is not a host name (an RFC 1123 name or an IPv4 address)")
    return list(dict.fromkeys(hosts))


def add_consul_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Consul connection (flags win over CONSUL_* variables)")
    group.add_argument("--http-addr", metavar="ADDR",
                       help="agent address, host:port or http[s]://host:port (env CONSUL_HTTP_ADDR; default "
                            "127.0.0.1:8500)")
    group.add_argument("--token",
                       help="ACL token (env CONSUL_HTTP_TOKEN); prefer --token-file: command lines are visible to "
                            "other users, and under horovodrun discovery refuses both unless "
                            "HVD_ELASTIC_ALLOW_EXPOSED_TOKEN=1")
    group.add_argument("--token-file", metavar="PATH", help="file holding the ACL token (env CONSUL_HTTP_TOKEN_FILE)")
    group.add_argument("--ca-file", metavar="PATH", help="CA bundle for https (env CONSUL_CACERT)")
    group.add_argument("--client-cert", metavar="PATH", help="client certificate for https (env CONSUL_CLIENT_CERT)")
    group.add_argument("--client-key", metavar="PATH", help="client key for https (env CONSUL_CLIENT_KEY)")
    group.add_argument("--datacenter", metavar="DC", default=env(DATACENTER_ENV),
                       help="datacenter to query (env HVD_ELASTIC_DATACENTER; default the agent's)")


def add_service_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--service",
        default=env(SERVICE_ENV, DEFAULT_SERVICE),
        help="Consul service name of the training nodes (env HVD_ELASTIC_SERVICE; default %(default)s)",
    )


def one_line_errors(parser: argparse.ArgumentParser, prog: str | None = None) -> None:
    """Bad input is ONE stderr line naming the value and what was expected (no usage block), exit 2.

    ``prog`` names the command in that line (default the parser's own).  A default read from a variable
    (:func:`env`) that its type refuses is reported as that variable's, not as the flag's.
    """
    name = prog or parser.prog
    # argparse's one conversion of a value, given or default (the class's: a second call wraps it once only).
    convert = type(parser)._get_value.__get__(parser)
    sources: dict[str, str] = {}  # dest -> the variable its value came from, for setting()
    parser.set_defaults(_env_sources=sources)

    def error(message: str):
        parser.exit(2, f"{name}: error: {message}\n")

    def get_value(action: argparse.Action, text: str):
        try:
            value = convert(action, text)
        except argparse.ArgumentError as exc:
            if not isinstance(text, EnvValue):
                raise
            flag = "/".join(action.option_strings)
            raise argparse.ArgumentError(None, f"{text.variable} (the default of {flag}): {exc.message}") from None
        if isinstance(text, EnvValue):
            sources[action.dest] = text.variable
        return value

    # Instance attributes over argparse's methods: this parser's errors and conversions only.
    parser.error = error  # type: ignore[method-assign]
    parser._get_value = get_value  # type: ignore[method-assign,assignment]


def fail(prog: str, message: object, code: int) -> int:
    """Print the one error line of every command, ``PROG: error: MESSAGE``, on stderr; return ``code``."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code


def command_name(args: argparse.Namespace) -> str:
    """How the running command calls itself in errors (``hvd-elastic discover``, ``consul_hosts``)."""
    return getattr(args, "_prog", None) or f"hvd-elastic {getattr(args, 'command', None) or ''}".strip()


#: What a command that talks to Consul expects to fail with: bad settings (exit 2) or Consul (exit 1).
CONSUL_FAILURES = (ConfigError, ConsulError)


def explain_failure(prog: str, exc: Exception) -> int:
    """Print ``exc`` as :func:`fail` does and return the exit code: 2 for bad input, else 1."""
    return fail(prog, exc, 2 if isinstance(exc, (ConfigError, argparse.ArgumentTypeError)) else 1)


def stop_on_signals(log: logging.Logger, action: str) -> contextlib.AbstractContextManager[threading.Event]:
    """A context manager: an event set by SIGTERM or SIGINT, for long-running commands that stop cleanly.

    The previous handlers are restored on exit, so in-process callers (tests)
    get their own signal handling back.
    """
    import contextlib  # here, not at the top: discovery's path never stops on signals
    import signal
    import threading

    @contextlib.contextmanager
    def handled() -> Iterator[threading.Event]:
        stop = threading.Event()

        def on_signal(signum, _frame):
            log.info("received %s; %s", signal.Signals(signum).name, action)
            stop.set()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield stop
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    return handled()


def consul_config(args: argparse.Namespace, *, addr: str | None = None,
                  addr_flag: str = "--http-addr") -> ConsulConfig:
    """The connection settings from the flags above and the environment (``addr``, named ``addr_flag`` in errors,
    instead of ``--http-addr`` when given); raises ConfigError."""
    return ConsulConfig.from_env(
        addr=addr or args.http_addr,
        addr_flag=addr_flag if addr else "--http-addr",
        token=args.token,
        token_file=args.token_file,
        ca_file=args.ca_file,
        client_cert=args.client_cert,
        client_key=args.client_key,
        datacenter=args.datacenter,
    )


__all__ = [
    "CONSUL_FAILURES",
    "ConfigError",
    "DEFAULT_SERVICE",
    "EnvValue",
    "add_consul_arguments",
    "argparse_type",
    "argument_type",
    "boolean",
    "add_service_argument",
    "command_name",
    "consul_config",
    "env",
    "env_list",
    "explain_failure",
    "fail",
    "host_list",
    "log_level",
    "non_negative_seconds",
    "one_line_errors",
    "positive_int",
    "positive_number",
    "positive_seconds",
    "setting",
    "stop_on_signals",
]
