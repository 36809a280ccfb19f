"""The node agent: keep this node's training service registered and its TTL check honest.

Contract:

* On start it probes the node, then registers the service in the LOCAL Consul
  agent with ``Meta.slots`` and hardware facts and one TTL check whose initial
  status is the probe result (so a healthy node is discoverable at once).
* Every ``interval`` seconds (a third of the TTL by default) it probes again
  and reports the result through the TTL check (pass/warn/fail, reason in the
  check's Output).  If the agent stops (process killed, node frozen) the TTL
  expires and Consul marks the node critical: horovodrun drops it.
* If Consul no longer knows the check (its agent restarted and lost its
  state) the service is registered again.  Consul says so only as a 500 whose
  text changed across versions, so a refused update is followed by a look at
  ``GET /v1/agent/checks``: the check missing there is the signal, not the text.
* While its Consul agent is unreachable it looks for it every
  ``OUTAGE_POLL_S`` (a cheap ``/v1/status/leader``, no probe) and reports as
  soon as it answers: a restarted Consul agent brings every check back critical
  until its next update (Consul keeps a restored check out of rotation until
  it passes), and each moment of that is a moment discovery may drop the node.
* Health transitions and Consul reachability changes are logged once each.
* Its metrics (:class:`~hvd_elastic.metrics.nodeagent.NodeAgentMetrics`) are
  updated as it goes; with ``watch_maintenance`` each tick also reads whether the
  service is drained (one ``GET /v1/agent/checks`` of the local agent).
* A token from a file is read again every tick, so a token rotated in place
  (Vault Agent and the like) takes effect without a restart.
* Errors that waiting cannot heal end it (:class:`Refused`): Consul refusing
  the first registration (400 a bad definition; 403 a token without the
  rights, unless it comes from a file, which may be rotated in place), or the
  service ID kept already by another live node agent of this host
  (``Meta.node_agent``: its pid and start time): taking it over would change
  that agent's slots and deregister it when this one stops.
* With ``straggler_drains`` each tick also carries out a job's request to drain
  this node for being slow, and lifts such a drain after its cool-down
  (:mod:`.straggler_drain`).
* :meth:`NodeAgent.close` deregisters the service (the CLI calls it on SIGTERM
  and SIGINT).  Maintenance mode (``hvd-elastic drain``) is a separate check the
  agent never touches while it runs, so a drained node stays drained.
* With ``leave_timeout`` > 0 a stop first drains the node (maintenance on) and
  waits up to that long for the job's workers to leave it (:mod:`.leave`), so
  that a node handed back (a Slurm allocation ending, a pod terminating) is
  removed gracefully, without a rollback.  Deregistering at once would do the
  same only if the workers outlived the deregistration by a reset, which
  nothing guarantees.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Sequence

import psutil

from hvd_elastic.consul import api
from hvd_elastic.consul.config import ConfigError, ConsulConfig
from hvd_elastic.consul.errors import ConsulError
from hvd_elastic.metrics.nodeagent import NodeAgentMetrics
from hvd_elastic.nodeagent.leave import wait_for_leave
from hvd_elastic.nodeagent.probes import CRITICAL, PASSING, Probe, ProbeResult, run_probes
from hvd_elastic.nodeagent.straggler_drain import StragglerDrains

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

    def service_definition(self, status: str) -> dict:
        """The body of ``PUT /v1/agent/service/register``, its check starting at ``status``."""
        body: dict = {"Name": self.service, "ID": self.service_id, "Tags": list(self.tags), "Meta": dict(self.meta),
                      "Check": self.check_definition(status)}
        if self.address is not None:
            body["Address"] = self.address
        if self.port is not None:
            body["Port"] = self.port
        return body


#: Seconds between looks for an unreachable Consul agent (see the module docstring).
OUTAGE_POLL_S = 0.1

#: Meta key naming the process that keeps an instance registered: ``PID-START`` (its start time, as psutil
#: reads it: a pid reused by another process does not match).
KEEPER_META = "node_agent"


class Refused(Exception):
    """The agent cannot register with these settings, and waiting will not change that."""


def process_id(pid: int) -> str:
    """``PID-START`` of process ``pid``, what its node agent writes in ``Meta.node_agent``."""
    return f"{pid}-{psutil.Process(pid).create_time():.2f}"


def this_process() -> str:
    return process_id(os.getpid())


def _keeper_alive(keeper: str) -> bool:
    pid = keeper.partition("-")[0]
    try:
        return pid.isdigit() and process_id(int(pid)) == keeper and psutil.Process(int(pid)).status() != "zombie"
    except psutil.Error:  # gone, or not ours to look at
        return False


class NodeAgent:
    """Registers one service instance and reports probe results through its TTL check."""

    def __init__(self, config: ConsulConfig, registration: Registration, probes: Sequence[Probe], interval: float,
                 leave_timeout: float = 0.0, metrics: NodeAgentMetrics | None = None, watch_maintenance: bool = False,
                 straggler_drains: StragglerDrains | None = None):
        self.config = config
        self.leave_timeout = leave_timeout
        self.registration = registration
        self.probes = list(probes)
        self.interval = interval
        self.timeout = max(1.0, min(api.DEFAULT_TIMEOUT_S, interval))  # a call never outlasts a tick
        self.registered = False
        self._claimed = False  # registered once: the service ID is this agent's
        self._last_status: str | None = None
        self._consul_ok: bool | None = None
        self.metrics = metrics or NodeAgentMetrics()
        self.watch_maintenance = watch_maintenance
        self.straggler_drains = straggler_drains

    # -- Consul calls -------------------------------------------------------

    def register(self, result: ProbeResult) -> None:
        reg = self.registration
        try:
            if not self._claimed:
                self._claim()
            api.register_service(self.config, reg.service_definition(result.status), self.timeout)
        except ConsulError as exc:
            if not self._claimed and self._never_heals(exc):
                raise Refused(f"{exc}; not retrying: Consul refused the first registration, and waiting "
                              "does not change its answer") from None
            raise
        self._claimed = True
        self.registered = True
        self.metrics.registered.set(1)
        self.metrics.registrations.inc()
        log.info("registered service %r (id %r, slots %s) in %s", reg.service, reg.service_id, reg.meta.get("slots"),
                 self.config.base_url)

    def _never_heals(self, exc: ConsulError) -> bool:
        """Whether Consul's refusal stands whatever the agent waits for: a 4xx, but a 403 only when the token
        is fixed (a token file may be rotated in place, by Vault Agent and the like, to one with the rights)."""
        if exc.status == 403:
            return not self.config.token_file
        return exc.status is not None and 400 <= exc.status < 500

    def _claim(self) -> None:
        """Refuse a service ID another live node agent of this host keeps (see the module docstring)."""
        reg = self.registration
        existing = api.agent_service(self.config, reg.service_id, self.timeout) or {}
        meta = existing.get("Meta") or {}
        keeper = meta.get(KEEPER_META, "")
        if (keeper and keeper != reg.meta.get(KEEPER_META) and meta.get("host") == reg.meta.get("host")
                and _keeper_alive(keeper)):
            raise Refused(f"service ID {reg.service_id!r} is kept by the node agent pid {keeper.split('-')[0]} "
                          f"of this host (Consul at {self.config.base_url}): give this one another --service-id, "
                          "or stop that one first")

    def report(self, result: ProbeResult) -> bool:
        """Send one TTL update; False when Consul does not know the check any more."""
        check_id = self.registration.check_id
        try:
            api.update_ttl(self.config, check_id, result.status, result.output[:MAX_OUTPUT], self.timeout)
            self.metrics.ttl["ok"].inc()
            return True
        except ConsulError as exc:
            self.metrics.ttl["error"].inc()
            if exc.status is None:  # Consul did not answer: nothing is known about the check
                raise
            if api.has_check(self.config, check_id, self.timeout):
                raise  # refused for another reason (ACLs, a server error): say so, keep the registration
            return False

    def close(self) -> None:
        """Deregister the service (and its check); errors are logged, not raised."""
        if not self.registered:
            return
        try:
            api.deregister_service(self.config, self.registration.service_id, self.timeout)
            self.registered = False
            self.metrics.registered.set(0)
            log.info("deregistered service id %r", self.registration.service_id)
        except (ConsulError, ConfigError) as exc:
            log.warning("could not deregister service id %r: %s", self.registration.service_id, exc)

    def leave(self) -> list[int]:
        """Drain this instance, then wait up to ``leave_timeout`` for the workers to go; the pids left behind."""
        reg = self.registration
        try:
            api.set_maintenance(self.config, reg.service_id, True, "node agent stopping: waiting for the job to leave")
        except (ConsulError, ConfigError) as exc:
            log.warning("could not drain service id %r before leaving: %s", reg.service_id, exc)
            return []  # discovery still lists the node: waiting would only delay the stop
        log.info("drained service id %r; waiting up to %gs for the job to leave", reg.service_id, self.leave_timeout)
        started = time.monotonic()
        remaining = wait_for_leave(self.leave_timeout,
                                   on_wait=lambda pids: log.info("Horovod workers here: pids %s", pids))
        if remaining:
            log.warning("Horovod workers still running after %gs: pids %s", self.leave_timeout, remaining)
        else:
            log.info("the job has left this node (%.1fs after the drain)", time.monotonic() - started)
        return remaining

    # -- the loop -----------------------------------------------------------

    def tick(self) -> ProbeResult:
        """Probe once and bring Consul up to date; Consul errors are retried at the next tick, except
        :class:`Refused`, raised for those that never heal."""
        result = run_probes(self.probes, observe=self.metrics.on_probe)
        self._note_health(result)
        try:
            self.config = self.config.with_fresh_token()  # a rotated token file is followed, not outlived
            if not self.registered or not self.report(result):
                if self.registered:
                    log.warning("Consul lost check %r (agent restarted?); registering again",
                                self.registration.check_id)
                self.register(result)
                self.report(result)
            if self.watch_maintenance:
                checks = api.agent_checks(self.config, self.timeout)
                sid = self.registration.service_id
                self.metrics.on_maintenance(sid, api.maintenance_check_id(sid) in checks)
            if self.straggler_drains is not None:
                self.straggler_drains.tick(self.config, self.timeout)
            self._note_consul(None)
        except (ConsulError, ConfigError) as exc:
            self._note_consul(exc)
        return result

    def run(self, stop: threading.Event) -> None:
        """Tick every ``interval`` seconds until ``stop`` is set, then leave (if configured) and deregister."""
        try:
            self.tick()
            while not self._wait(stop):
                self.tick()
            if self.leave_timeout > 0 and self.registered:
                self.leave()
        finally:
            self.close()

    def _wait(self, stop: threading.Event) -> bool:
        """Until the next tick (True: ``stop`` was set): ``interval`` seconds, cut short by Consul's return."""
        if self._consul_ok is not False:
            return stop.wait(self.interval)
        deadline = time.monotonic() + self.interval
        while (left := deadline - time.monotonic()) > 0:
            if stop.wait(min(OUTAGE_POLL_S, left)):
                return True
            try:
                if api.leader(self.config, timeout=OUTAGE_POLL_S):
                    return False
            except (ConsulError, ConfigError):
                pass
        return stop.is_set()

    def _note_health(self, result: ProbeResult) -> None:
        self.metrics.on_health(result.status)
        if result.status != self._last_status:
            level = logging.INFO if result.status == PASSING else logging.WARNING
            before = self._last_status or "unknown"
            log.log(level, "health %s -> %s: %s", before, result.status, result.output)
            self._last_status = result.status

    def _note_consul(self, exc: BaseException | None) -> None:
        ok = exc is None
        if exc is not None:
            self.metrics.on_consul_error(exc)
        if ok != self._consul_ok:
            if ok:
                log.info("Consul agent at %s reachable", self.config.base_url)
            else:
                log.warning("%s; retrying every %.1f s", exc, self.interval)
            self._consul_ok = ok


__all__ = ["CRITICAL", "KEEPER_META", "NodeAgent", "Refused", "Registration", "process_id", "this_process"]
