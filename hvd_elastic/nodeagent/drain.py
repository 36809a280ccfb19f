"""Maintenance mode for this node's training service: what ``hvd-elastic drain`` and ``undrain`` do.

Drain puts every instance of the service registered on the LOCAL Consul agent
(or just one service ID) into maintenance: Consul adds a critical
``_service_maintenance:<id>`` check, discovery stops listing the node, and
horovodrun removes it at the next reset -- a graceful removal, so the
survivors continue from memory without a rollback.  Undrain lifts it.  Both
are idempotent.  The node agent keeps running meanwhile and never clears
maintenance itself, except a straggler drain of its own after its cool-down
(:mod:`.straggler_drain`): a drain by hand of a node drained for being slow
replaces that reason with its own, so the node stays out until undrained by hand.

It talks to the agent through :mod:`hvd_elastic.consul.api`, the stdlib client
discovery uses (drain sits on the path from "node must leave" to "job trains
without it", so it starts fast).  The commands are
:mod:`hvd_elastic.commands.drain` and :mod:`hvd_elastic.commands.undrain`.
"""

from __future__ import annotations

import getpass
import socket
import time

from hvd_elastic.consul import api
from hvd_elastic.consul.config import ConsulConfig
from hvd_elastic.errors import HvdElasticError
from hvd_elastic.health import hosts, stragglers


def default_reason() -> str:
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
    checks = api.agent_checks(config) if enable else {}
    for sid in targets:
        current = checks.get(api.maintenance_check_id(sid))
        if isinstance(current, dict) and stragglers.parse_reason(hosts.maintenance_reason(current)):
            # Consul keeps the first reason of a service already in maintenance: make this drain the operator's.
            api.set_maintenance(config, sid, False)
        api.set_maintenance(config, sid, enable, reason)
    return targets
