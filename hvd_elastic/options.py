"""Command-line options shared by discovery, the node agent, drain and status.

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

from hvd_elastic.consul.config import ConfigError, ConsulConfig, parse_bool

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
boolean = argument_type(lambda text: parse_bool("", text), lambda _: True, "a boolean (true or false)")


def add_consul_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Consul connection (flags win over CONSUL_* variables)")
    group.add_argument("--http-addr", metavar="ADDR", help="agent address, host:port or http[s]://host:port (env CONSUL_HTTP_ADDR; default 127.0.0.1:8500)")
    group.add_argument("--token", help="ACL token (env CONSUL_HTTP_TOKEN); prefer --token-file: command lines are visible to other users, and under horovodrun discovery refuses both unless HVD_ELASTIC_ALLOW_EXPOSED_TOKEN=1")
    group.add_argument("--token-file", metavar="PATH", help="file holding the ACL token (env CONSUL_HTTP_TOKEN_FILE)")
    group.add_argument("--ca-file", metavar="PATH", help="CA bundle for https (env CONSUL_CACERT)")
    group.add_argument("--client-cert", metavar="PATH", help="client certificate for https (env CONSUL_CLIENT_CERT)")
    group.add_argument("--client-key", metavar="PATH", help="client key for https (env CONSUL_CLIENT_KEY)")
    group.add_argument("--datacenter", metavar="DC", default=env("HVD_ELASTIC_DATACENTER"), help="datacenter to query (env HVD_ELASTIC_DATACENTER; default the agent's)")


def add_service_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--service",
        default=env("HVD_ELASTIC_SERVICE", DEFAULT_SERVICE),
        help="Consul service name of the training nodes (env HVD_ELASTIC_SERVICE; default %(default)s)",
    )


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
    "ConfigError",
    "DEFAULT_SERVICE",
    "add_consul_arguments",
    "argument_type",
    "boolean",
    "add_service_argument",
    "consul_config",
    "env",
    "env_list",
    "non_negative_float",
    "positive_float",
    "positive_int",
]
