"""``hvd-elastic drain`` / ``hvd-elastic undrain``: maintenance mode for this node's training service.

Drain puts every instance of the service registered on the LOCAL Consul agent
(or just ``--service-id``) into maintenance: Consul adds a critical
``_service_maintenance:<id>`` check, discovery stops listing the node, and
horovodrun removes it at the next reset -- a graceful removal, so the
survivors continue from memory without a rollback.  Undrain lifts it.  Both
are idempotent.  The node agent keeps running meanwhile and never clears
maintenance itself.

It talks to the agent with the same small stdlib client as discovery (no
py-consul/requests import: drain sits on the path from "node must leave" to
"job trains without it").  Exit codes: 0 done, 1 Consul failed or no such
service on this agent, 2 bad input.
"""

from __future__ import annotations

import argparse
import getpass
import socket
import sys
import time
from urllib.parse import quote

from hvd_elastic.discovery.cli import FAILURES, explain_failure
from hvd_elastic.options import add_consul_arguments, add_service_argument, consul_config, env
from hvd_elastic.consul.client import ConsulError, check_not_hidden, get_json

# A human or a Slurm epilog waits on this; retries of an unreachable agent fit inside.
TIMEOUT_S = 5.0


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
    enable = args.command == "drain"
    verb = "drain" if enable else "undrain"
    reason = (getattr(args, "reason", None) or _default_reason()) if enable else None
    try:
        config = consul_config(args)
        services = check_not_hidden(config, get_json(config, "/v1/agent/services", timeout=TIMEOUT_S), TIMEOUT_S)
        if not isinstance(services, dict):
            raise ConsulError(f"Consul at {config.base_url} answered /v1/agent/services with something that is not an object", retryable=False)
        instances = sorted(sid for sid, info in services.items() if isinstance(info, dict) and info.get("Service") == args.service)
        targets = [args.service_id] if args.service_id else instances
        missing = [sid for sid in targets if sid not in instances]
        if not targets or missing:
            what = f"service id {missing[0]!r} of service {args.service!r} is not" if missing else f"no instance of service {args.service!r} is"
            print(f"{verb}: {what} registered on the Consul agent at {config.base_url}", file=sys.stderr)
            return 1
        for sid in targets:
            query = [("enable", "true" if enable else "false")] + ([("reason", reason)] if reason else [])
            get_json(config, f"/v1/agent/service/maintenance/{quote(sid, safe='')}", query, timeout=TIMEOUT_S, method="PUT")
    except FAILURES as exc:
        return explain_failure(verb, args.service, exc)
    state = f"in maintenance ({reason})" if enable else "out of maintenance"
    for sid in targets:
        print(f"{sid}: {state}")
    return 0
