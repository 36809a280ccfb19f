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
from hvd_elastic.envvars import ConfigError, parse_bool
from hvd_elastic.consul.errors import ConsulError
from hvd_elastic.standby import protocol

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: discovery's full path imports this module
if TYPE_CHECKING:
    import logging
    import threading
    from collections.abc import Iterator

DEFAULT_SERVICE = "horovod"


def env(name: str, default: str | None = None) -> str | None:
    """``os.environ[name]`` when set and non-empty, else ``default``."""
    return os.environ.get(name) or default


def env_list(name: str) -> list[str]:
    """A comma-separated variable as a list, blanks dropped."""
    return [item.strip() for item in (os.environ.get(name) or "").split(",") if item.strip()]


def argument_type(convert, accept, expected: str):
    """An argparse ``type=``: ``convert(text)``, rejected unless ``accept(value)``."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not accept(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not {expected}")
        return value

    parse.__name__ = expected
    return parse


positive_int = argument_type(int, lambda v: v > 0, "a positive integer")
positive_float = argument_type(float, lambda v: 0 < v < float("inf"), "a positive number of seconds")
non_negative_float = argument_type(float, lambda v: 0 <= v < float("inf"), "a number of seconds >= 0")
standby_name = argument_type(str, protocol.valid_name, f"a standby name ({protocol.NAME_RULE})")
boolean = argument_type(lambda text: parse_bool("", text), lambda _: True, "a boolean (true or false)")


def host_list(text: str) -> list[str]:
    """An argparse ``type=``: comma-separated host names, each one a name ssh may be handed.

    The same rule as discovery's (:func:`hvd_elastic.discovery.hosts.is_valid_host`:
    an RFC 1123 name or a dotted IPv4 address); the first bad entry is named, never repaired.
    """
    from hvd_elastic.discovery.hosts import is_valid_host  # here: discovery's fast path never parses a host list

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
    group.add_argument("--datacenter", metavar="DC", default=env("HVD_ELASTIC_DATACENTER"),
                       help="datacenter to query (env HVD_ELASTIC_DATACENTER; default the agent's)")


def add_service_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--service",
        default=env("HVD_ELASTIC_SERVICE", DEFAULT_SERVICE),
        help="Consul service name of the training nodes (env HVD_ELASTIC_SERVICE; default %(default)s)",
    )


def one_line_errors(parser: argparse.ArgumentParser) -> None:
    """Bad input is ONE stderr line naming the value and what was expected (no usage block), exit 2."""

    def error(message: str):
        parser.exit(2, f"{parser.prog}: error: {message}\n")

    parser.error = error


#: What a command that talks to Consul expects to fail with: bad settings (exit 2) or Consul (exit 1).
CONSUL_FAILURES = (ConfigError, ConsulError)


def explain_failure(command: str, exc: Exception) -> int:
    """Print ``command: <one line>`` on stderr and return the exit code: 2 for bad input, else 1."""
    print(f"{command}: {exc}", file=sys.stderr)
    return 2 if isinstance(exc, (ConfigError, argparse.ArgumentTypeError)) else 1


def stop_on_signals(log: logging.Logger, action: str) -> Iterator[threading.Event]:
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


def consul_config(args: argparse.Namespace) -> ConsulConfig:
    """The connection settings from the flags above and the environment; raises ConfigError."""
    return ConsulConfig.from_env(
        addr=args.http_addr,
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
    "add_consul_arguments",
    "argument_type",
    "boolean",
    "add_service_argument",
    "consul_config",
    "env",
    "env_list",
    "explain_failure",
    "host_list",
    "non_negative_float",
    "one_line_errors",
    "positive_float",
    "positive_int",
    "standby_name",
    "stop_on_signals",
]
