"""``hvd-elastic drain`` / ``hvd-elastic undrain``: maintenance mode for this node's training service.

Drain puts every instance of the service registered on the LOCAL Consul agent
(or just ``--service-id``) into maintenance: Consul adds a critical
``_service_maintenance:<id>`` check, discovery stops listing the node, and
horovodrun removes it at the next reset -- a graceful removal, so the
survivors continue from memory without a rollback.  Undrain lifts it.  Both
are idempotent.  The node agent keeps running meanwhile and never clears
maintenance itself.

It talks to the agent through :mod:`hvd_elastic.consul.api`, the stdlib client
discovery uses (drain sits on the path from "node must leave" to "job trains
without it", so it starts fast).

``drain --wait SECONDS`` then waits until the job has left the node (no
Horovod worker runs here any more, :mod:`.leave`): what a Slurm allocation or
a Kubernetes ``preStop`` hook needs before it hands the node back.

Exit codes: 0 done (and, with ``--wait``, the job has left), 1 Consul failed or
no such service on this agent, 2 bad input, 3 workers still running when
``--wait`` ran out.
"""

from __future__ import annotations

import argparse
import getpass
import socket
import time

from hvd_elastic.consul import api
from hvd_elastic.consul.config import ConsulConfig
from hvd_elastic.errors import HvdElasticError
from hvd_elastic.nodeagent.leave import wait_for_leave
from hvd_elastic.options import (
    CONSUL_FAILURES,
    add_consul_arguments,
    add_service_argument,
    command_name,
    consul_config,
    env,
    explain_failure,
    fail,
    non_negative_seconds,
)

#: Exit code of ``drain --wait`` when workers still ran at its end.
STILL_RUNNING = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_service_argument(parser)
    parser.add_argument("--service-id", default=env("HVD_ELASTIC_SERVICE_ID"),
                        help="only this instance (env HVD_ELASTIC_SERVICE_ID; default every instance of --service on "
                             "this agent)")
    if not parser.prog.endswith("undrain"):
        parser.add_argument("--reason",
                            help="why, shown by `hvd-elastic status` and Consul (default: who drained it and when)")
        parser.add_argument("--wait", type=non_negative_seconds, default=0.0, metavar="SECONDS",
                            help="then wait up to SECONDS until no Horovod worker runs on this node "
                                 "(exit 3 if some still do; default 0: do not wait)")
    add_consul_arguments(parser)


def _default_reason() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"drained by {user}@{socket.gethostname()} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}"


class NotRegistered(HvdElasticError, LookupError):
    """The service (or service ID) to drain is not registered on this agent."""


def set_maintenance(config: ConsulConfig, service: str, service_id: str | None, enable: bool,
                    reason: str | None) -> list[str]:
    """Maintenance on (``enable``) or off for ``service_id``, or every instance of ``service`` on this agent.

    Returns the service IDs changed.  Raises NotRegistered, ConsulError or ConfigError.
    """
    services = api.agent_services(config)
    instances = sorted(sid for sid, info in services.items()
                       if isinstance(info, dict) and info.get("Service") == service)
    targets = [service_id] if service_id else instances
    missing = [sid for sid in targets if sid not in instances]
    if not targets or missing:
        what = (f"service id {missing[0]!r} of service {service!r} is not" if missing
                else f"no instance of service {service!r} is")
        raise NotRegistered(f"{what} registered on the Consul agent at {config.base_url}")
    for sid in targets:
        api.set_maintenance(config, sid, enable, reason)
    return targets


def run(args: argparse.Namespace) -> int:
    enable = args.command == "drain"
    reason = (getattr(args, "reason", None) or _default_reason()) if enable else None
    try:
        targets = set_maintenance(consul_config(args), args.service, args.service_id, enable, reason)
    except CONSUL_FAILURES + (NotRegistered,) as exc:
        return explain_failure(command_name(args), exc)
    state = f"in maintenance ({reason})" if enable else "out of maintenance"
    for sid in targets:
        print(f"{sid}: {state}")
    if enable and args.wait > 0:
        remaining = wait_for_leave(args.wait, on_wait=lambda pids: print(
            f"waiting up to {args.wait:g}s for {len(pids)} Horovod worker(s) to leave: "
            f"pids {' '.join(map(str, pids))}", flush=True))
        if remaining:
            return fail(command_name(args), f"{len(remaining)} Horovod worker(s) still running after {args.wait:g}s: "
                                            f"pids {' '.join(map(str, remaining))}", STILL_RUNNING)
        print("the job has left this node")
    return 0
