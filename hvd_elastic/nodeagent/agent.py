"""The node agent: keep this node's training service registered and its TTL check honest.

Contract:

* On start it probes the node, then registers the service in the LOCAL Consul
  agent with ``Meta.slots`` and hardware facts and one TTL check whose initial
  status is the probe result (so a healthy node is discoverable at once).
* Every ``interval`` seconds (a third of the TTL by default) it probes again
  and reports the result through the TTL check (pass/warn/fail, reason in the
  check's Output).  If the agent stops (process killed, node frozen) the TTL
  expires and Consul marks the node critical: horovodrun drops it.
* If Consul no longer knows the check (its agent restarted and lost its state:
  ``does not have associated TTL``) the service is registered again.
* Health transitions and Consul reachability changes are logged once each.
* :meth:`NodeAgent.close` deregisters the service (the CLI calls it on SIGTERM
  and SIGINT).  Maintenance mode (``hvd-elastic drain``) is a separate check the
  agent never touches, so a drained node stays drained while the agent runs.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence

from hvd_elastic.consul.config import ConsulConfig
from hvd_elastic.nodeagent import client as consul_client
from hvd_elastic.nodeagent.probes import CRITICAL, PASSING, WARNING, Probe, ProbeResult, run_probes

log = logging.getLogger("hvd_elastic.nodeagent")

# Consul caps a check's Output; keep ours readable and bounded.
MAX_OUTPUT = 1000


@dataclasses.dataclass(frozen=True)
class Registration:
    """What the agent registers: the service instance and its TTL check."""

    service: str
    service_id: str
    meta: dict[str, str]
    ttl: float
    deregister_after: str = "10m"
    address: str | None = None
    port: int | None = None
    tags: tuple[str, ...] = ()

    @property
    def check_id(self) -> str:
        # Consul's own ID for a service's single unnamed check.
        return f"service:{self.service_id}"

    def check_definition(self, status: str) -> dict[str, str]:
        return {
            "Name": f"{self.service} node health (hvd-elastic node-agent)",
            "TTL": f"{self.ttl:g}s",
            "Status": status,
            "DeregisterCriticalServiceAfter": self.deregister_after,
        }


class NodeAgent:
    """Registers one service instance and reports probe results through its TTL check."""

    def __init__(self, config: ConsulConfig, registration: Registration, probes: Sequence[Probe], interval: float):
        self.config = config
        self.registration = registration
        self.probes = list(probes)
        self.interval = interval
        self.client = consul_client.connect(config, timeout=max(1.0, min(5.0, interval)))
        self.registered = False
        self._last_status: str | None = None
        self._consul_ok: bool | None = None

    # -- Consul calls -------------------------------------------------------

    def register(self, result: ProbeResult) -> None:
        reg = self.registration
        self.client.agent.service.register(
            reg.service,
            service_id=reg.service_id,
            address=reg.address,
            port=reg.port,
            tags=list(reg.tags),
            meta=reg.meta,
            check=reg.check_definition(result.status),
        )
        self.registered = True
        log.info("registered service %r (id %r, slots %s) in %s", reg.service, reg.service_id, reg.meta.get("slots"), self.config.base_url)

    def report(self, result: ProbeResult) -> bool:
        """Send one TTL update; False when Consul does not know the check any more."""
        ttl = self.client.agent.check
        send = {PASSING: ttl.ttl_pass, WARNING: ttl.ttl_warn}.get(result.status, ttl.ttl_fail)
        try:
            return bool(send(self.registration.check_id, notes=result.output[:MAX_OUTPUT]))
        except consul_client.consul.ConsulException as exc:
            if "does not have associated TTL" in str(exc) or "nknown check" in str(exc):
                return False
            raise

    def close(self) -> None:
        """Deregister the service (and its check); errors are logged, not raised."""
        if not self.registered:
            return
        try:
            self.client.agent.service.deregister(self.registration.service_id)
            self.registered = False
            log.info("deregistered service id %r", self.registration.service_id)
        except consul_client.ERRORS as exc:
            log.warning("could not deregister service id %r: %s", self.registration.service_id, consul_client.describe(exc, self.config))

    # -- the loop -----------------------------------------------------------

    def tick(self) -> ProbeResult:
        """Probe once and bring Consul up to date; never raises for Consul errors."""
        result = run_probes(self.probes)
        self._note_health(result)
        try:
            if not self.registered or not self.report(result):
                if self.registered:
                    log.warning("Consul lost check %r (agent restarted?); registering again", self.registration.check_id)
                self.register(result)
                self.report(result)
            self._note_consul(None)
        except consul_client.ERRORS as exc:
            self._note_consul(exc)
        return result

    def run(self, stop: threading.Event) -> None:
        """Tick every ``interval`` seconds until ``stop`` is set, then deregister."""
        try:
            self.tick()
            while not stop.wait(self.interval):
                self.tick()
        finally:
            self.close()

    def _note_health(self, result: ProbeResult) -> None:
        if result.status != self._last_status:
            level = logging.INFO if result.status == PASSING else logging.WARNING
            before = self._last_status or "unknown"
            log.log(level, "health %s -> %s: %s", before, result.status, result.output)
            self._last_status = result.status

    def _note_consul(self, exc: BaseException | None) -> None:
        ok = exc is None
        if ok != self._consul_ok:
            if ok:
                log.info("Consul agent at %s reachable", self.config.base_url)
            else:
                log.warning("%s; retrying every %.1f s", consul_client.describe(exc, self.config), self.interval)
            self._consul_ok = ok


__all__ = ["CRITICAL", "NodeAgent", "Registration"]
