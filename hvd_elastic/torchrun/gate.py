"""Whether this node may be in the job: its node agent's health, read from the local Consul agent.

What discovery decides for horovodrun (a host whose instance is in maintenance or not passing is not
listed), the gate decides for one torchrun agent about its own node, so the same ``hvd-elastic drain``
and the same node-agent probes take a node out of either kind of job.

Contract:

* :meth:`HealthGate.read` answers from ``GET /v1/agent/services`` and ``/v1/agent/checks`` of the node's
  own Consul agent, at most once per ``interval`` seconds (a cached answer in between): the instances of
  ``service`` on this agent, judged with their node-level checks as discovery judges them
  (:func:`hvd_elastic.health.hosts.check_health`).  Admitted: at least one instance, every one passing.
* ``required`` False (``health_gate=auto``): a node with no instance of the service is admitted (the
  user runs no node agent); True: it is kept out until one registers.
* Consul unreachable: the last answer stands (a blip of the agent never takes a node out); with no
  answer yet, the node is admitted.
"""

from __future__ import annotations

import dataclasses
import time

from hvd_elastic.consul import api
from hvd_elastic.consul.config import ConsulConfig
from hvd_elastic.consul.errors import ConsulError
from hvd_elastic.health.hosts import PASSING, MalformedResponse, check_health

_TIMEOUT_S = 2.0


@dataclasses.dataclass(frozen=True)
class Health:
    admitted: bool
    why: str  # what keeps the node out, or what admitted it
    registered: bool = True  # an instance of the service is on this node (False: no node agent gates it)


class HealthGate:
    def __init__(self, consul: ConsulConfig, service: str, *, required: bool, interval: float = 1.0):
        self.consul = consul
        self.service = service
        self.required = required
        self.interval = interval
        self._last: Health | None = None
        self._read_at = float("-inf")

    def read(self) -> Health:
        if self._last is not None and time.monotonic() - self._read_at < self.interval:
            return self._last
        try:
            judged = self.read_now()
        except (ConsulError, MalformedResponse) as exc:
            return self._last or Health(True, f"no answer from the local Consul agent yet ({exc})")
        self._last, self._read_at = judged, time.monotonic()
        return judged

    def read_now(self) -> Health:
        """The node's health read from its agent now, uncached; raises ConsulError or MalformedResponse."""
        return self.judge(api.agent_services(self.consul, _TIMEOUT_S), api.agent_checks(self.consul, _TIMEOUT_S))

    def judge(self, services: dict, checks: dict) -> Health:
        """The node's health from the agent's services and checks (``/v1/agent/*`` answers)."""
        ids = sorted(sid for sid, info in services.items()
                     if isinstance(info, dict) and info.get("Service") == self.service)
        if not ids:
            missing = f"no instance of service {self.service!r} is registered on this node's Consul agent"
            return Health(not self.required, missing + ("" if self.required else ": health does not gate it"),
                          registered=False)
        node_checks = [c for c in checks.values() if isinstance(c, dict) and not c.get("ServiceID")]
        for sid in ids:
            mine = [c for c in checks.values() if isinstance(c, dict) and c.get("ServiceID") == sid]
            status, maintenance, problems = check_health(node_checks + mine)
            if status != PASSING:
                detail = maintenance or problems
                return Health(False, f"{self.service} instance {sid} is {status}" + (f": {detail}" if detail else ""))
        return Health(True, f"every instance of {self.service!r} here is passing")
