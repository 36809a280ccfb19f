"""``hvd-elastic drain`` / ``hvd-elastic undrain``: maintenance mode for this node's training service.

Drain puts every instance of the service registered on the LOCAL Consul agent
(or just ``--service-id``) into maintenance: Consul adds a critical
``_service_maintenance:<id>`` check, discovery stops listing the node, and
horovodrun removes it at the next reset -- a graceful removal, so the
survivors continue from memory without a rollback.  Undrain lifts it.  Both
are idempotent.  The node agent keeps running meanwhile and never clears
maintenance itself.

Exit codes: 0 done, 1 Consul failed or no such service on this agent, 2 bad input.
"""

from __future__ import annotations

import argparse
import getpass
import socket
import sys
import time

from hvd_elastic.discovery.options import ConfigError, add_consul_arguments, add_service_argument, consul_config, env


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_service_argument(parser)
    parser.add_argument("--service-id", default=env("HVD_ELASTIC_SERVICE_ID"), help="only this instance (env HVD_ELASTIC_SERVICE_ID; default every instance of --service on this agent)")
    if not parser.prog.endswith("undrain"):
        parser.add_argument("--reason", help="why, shown by `hvd-elastic status` and Consul (default: who drained it and when)")
    add_consul_arguments(parser)


def _default_reason() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"drained by {user}@{socket.gethostname()} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}"


def run(args: argparse.Namespace) -> int:
    from hvd_elastic.nodeagent import client as consul_client

    enable = args.command == "drain"
    verb = "drain" if enable else "undrain"
    try:
        config = consul_config(args)
    except ConfigError as exc:
        print(f"{verb}: {exc}", file=sys.stderr)
        return 2
    client = consul_client.connect(config)
    reason = (getattr(args, "reason", None) or _default_reason()) if enable else None
    try:
        instances = consul_client.local_services(client, args.service)
        targets = [args.service_id] if args.service_id else sorted(instances)
        missing = [sid for sid in targets if sid not in instances]
        if not targets or missing:
            what = f"service id {missing[0]!r} of service {args.service!r} is not" if missing else f"no instance of service {args.service!r} is"
            print(f"{verb}: {what} registered on the Consul agent at {config.base_url}", file=sys.stderr)
            return 1
        for sid in targets:
            if not client.agent.service.maintenance(sid, "true" if enable else "false", reason=reason):
                print(f"{verb}: Consul agent at {config.base_url} did not accept maintenance for service id {sid!r}", file=sys.stderr)
                return 1
    except consul_client.ERRORS as exc:
        print(f"{verb}: {consul_client.describe(exc, config)}", file=sys.stderr)
        return 1
    state = f"in maintenance ({reason})" if enable else "out of maintenance"
    for sid in targets:
        print(f"{sid}: {state}")
    return 0
