"""``hvd-elastic consul-dev``: run the Consul-compatible development agent in the foreground."""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile

from hvd_elastic.consul.config import read_token_file
from hvd_elastic.options import command_name, fail, non_negative_seconds, positive_seconds, stop_on_signals

log = logging.getLogger("hvd_elastic.devagent")

EPILOG = """\
Each node gets its own agent HTTP port: --nodes gpu-a,gpu-b --http-port 8500 serves
gpu-a on 8500 and gpu-b on 8501 (--http-port 0 picks free ports).  Once every node
answers /v1/status/leader, the node->address map is printed on stdout as one JSON
line and, with --ready-file, written atomically to that file.

Simulating node failure: PUT /_dev/node/<name>/stop (or /start) on any live node's
port kills (or revives) that node's agent: its port closes and its serfHealth check
turns critical, so ?passing drops its services.  GET /_dev/nodes lists the nodes.
PUT /_dev/stale-lag?ms=N makes ?stale reads report X-Consul-LastContact: N (a lagging
follower).  With --acl-token these need the token, like every ACL-protected endpoint.

Partial rights: --acl-restricted-token-file FILE adds a second token that may only
read nodes named with a --acl-restricted-node-prefix and services named with a
--acl-restricted-service-prefix (each repeatable; "" matches every name).  Listings
drop what it may not read and answer X-Consul-Results-Filtered-By-ACLs: true.

SIGTERM or SIGINT stops every agent and exits 0.  Exit codes: 0 clean stop,
1 could not start (port in use, unreadable certificate), 2 bad arguments.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("--nodes", default="localhost",
                        help="comma-separated node names, one agent each (default %(default)s)")
    parser.add_argument("--http-port", type=int, default=8500,
                        help="HTTP port of the first node; the others follow (0: free ports; default %(default)s)")
    parser.add_argument("--bind", default="127.0.0.1", help="address to listen on (default %(default)s)")
    parser.add_argument("--acl-token", default=None,
                        help="enable ACLs (default_policy=deny) with this management token")
    parser.add_argument("--acl-token-file", default=None,
                        help="read the management token from this file (keeps it out of the process list)")
    parser.add_argument("--acl-restricted-token-file", default=None,
                        help="read a second, read-only token from this file (needs an ACL token; see below)")
    parser.add_argument("--acl-restricted-node-prefix", action="append", default=[], metavar="PREFIX",
                        help="the restricted token may read nodes whose name starts with PREFIX (repeatable)")
    parser.add_argument("--acl-restricted-service-prefix", action="append", default=[], metavar="PREFIX",
                        help="the restricted token may read services whose name starts with PREFIX (repeatable)")
    parser.add_argument("--tls-cert", default=None, help="PEM certificate: serve HTTPS")
    parser.add_argument("--tls-key", default=None, help="PEM private key for --tls-cert")
    parser.add_argument("--ready-file", default=None,
                        help='write {"<node>": "<host:port>", ...} here once every node answers')
    parser.add_argument("--reap-interval", type=positive_seconds, default=30.0,
                        help="time between DeregisterCriticalServiceAfter reaper runs (Consul: 30s)")
    parser.add_argument("--deregister-critical-min", type=non_negative_seconds, default=60.0,
                        help="floor of DeregisterCriticalServiceAfter (Consul: 1m)")
    parser.add_argument("--session-ttl-min", type=positive_seconds, default=10.0,
                        help="shortest session TTL accepted (Consul: 10s)")


def _token(args: argparse.Namespace) -> str | None:
    if args.acl_token and args.acl_token_file:
        raise ValueError("give --acl-token or --acl-token-file, not both")
    if args.acl_token_file:
        token = read_token_file("--acl-token-file", args.acl_token_file)  # a ConfigError, which is a ValueError
        if not token:
            raise ValueError(f"--acl-token-file {args.acl_token_file!r} is empty")
        return token
    if args.acl_token is not None and not args.acl_token:
        raise ValueError("--acl-token must not be empty")
    return args.acl_token


def _restricted_token(args: argparse.Namespace, token: str | None) -> str | None:
    if args.acl_restricted_token_file is None:
        if args.acl_restricted_node_prefix or args.acl_restricted_service_prefix:
            raise ValueError("--acl-restricted-node-prefix and --acl-restricted-service-prefix "
                             "need --acl-restricted-token-file")
        return None
    if token is None:
        raise ValueError("--acl-restricted-token-file needs --acl-token or --acl-token-file (ACLs on)")
    token = read_token_file("--acl-restricted-token-file", args.acl_restricted_token_file)
    if not token:
        raise ValueError(f"--acl-restricted-token-file {args.acl_restricted_token_file!r} is empty")
    return token


def write_ready_file(path: str, addresses: dict[str, str]) -> None:
    """Write the address map atomically (a reader never sees a partial file)."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".consul-dev-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(addresses, fh)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def run(args: argparse.Namespace) -> int:
    from hvd_elastic.devagent.cluster import DevCluster

    nodes = [n.strip() for n in args.nodes.split(",") if n.strip()]
    try:
        token = _token(args)
        if (args.tls_cert is None) != (args.tls_key is None):
            raise ValueError("--tls-cert and --tls-key must be given together")
        cluster = DevCluster(
            nodes=nodes, acl_token=token, tls_cert=args.tls_cert, tls_key=args.tls_key,
            reap_interval=args.reap_interval, deregister_critical_min=args.deregister_critical_min,
            http_port=args.http_port, bind=args.bind, session_ttl_min=args.session_ttl_min,
            restricted_token=_restricted_token(args, token),
            restricted_node_prefixes=args.acl_restricted_node_prefix,
            restricted_service_prefixes=args.acl_restricted_service_prefix,
        )
    except ValueError as exc:
        return fail(command_name(args), exc, 2)
    except OSError as exc:  # certificate or key unreadable
        return fail(command_name(args), f"cannot load TLS certificate/key: {exc}", 1)

    with stop_on_signals(log, "stopping") as stop:
        try:
            try:
                cluster.start()
            except OSError as exc:
                return fail(command_name(args), f"cannot listen on {args.bind}: {exc}", 1)
            addresses = cluster.addresses()
            if args.ready_file:
                write_ready_file(args.ready_file, addresses)
            print(json.dumps(addresses), flush=True)
            log.info("consul-dev ready (%s, ACLs %s): %s", "https" if cluster.tls else "http",
                     "on" if token else "off", ", ".join(f"{n}={a}" for n, a in addresses.items()))
            while not stop.wait(1.0):
                pass
            return 0
        finally:
            cluster.stop()
