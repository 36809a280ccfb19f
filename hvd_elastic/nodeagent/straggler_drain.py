"""The node's half of a straggler drain: carry out a job's request, and readmit the node after a cool-down.

A job with straggler policy ``drain`` asks through Consul's KV store
(:mod:`hvd_elastic.health.stragglers`); this node's agent is the only one that
can put its own service in maintenance, and it owns the readmission too, so a
drained node comes back even if the job that asked has ended or moved on.

Contract (one :meth:`StragglerDrains.tick` per node agent tick):

* a request for this instance (``KV_PREFIX/<service>/<node>/<service id>``)
  drains it with a reason that names the figures and the time it will be
  lifted, then the key is deleted; a request for an instance already in
  maintenance is dropped (an operator's drain stands as it is);
* a drain is lifted once its time has come, and only while its reason is still
  ours: ``hvd-elastic drain`` replaces the reason (:mod:`.drain`), and from then
  on the node stays out until an operator lifts it;
* the cool-down is ``cooldown`` for the first straggler drain of this agent,
  doubled for each one after it, at most ``limit``;
* the time to lift is in the reason, so an agent restarted meanwhile (its
  count restarts from the reason's number) still lifts it;
* a request that is not a request's JSON is deleted with one warning; a Consul
  that refuses the KV read or the drain (403: the token lacks ``key:read`` or
  ``service:write``) is one warning per distinct refusal, and the agent's other
  duties go on.  Any other Consul error propagates: the agent's loop retries.

Costs one KV read per tick (404 while nothing is asked), plus a read of the
agent's checks while a drain of ours is in force.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from hvd_elastic.consul import api
from hvd_elastic.consul.config import ConsulConfig
from hvd_elastic.consul.errors import ConsulError
from hvd_elastic.health import hosts, stragglers

log = logging.getLogger("hvd_elastic.nodeagent")

DEFAULT_COOLDOWN_S = 300.0
DEFAULT_LIMIT_S = 3600.0


class StragglerDrains:
    """Carries out straggler-drain requests for one service instance and lifts them (module docstring)."""

    def __init__(self, service: str, service_id: str, cooldown: float = DEFAULT_COOLDOWN_S,
                 limit: float = DEFAULT_LIMIT_S, clock: Callable[[], float] = time.time) -> None:
        if not 0 < cooldown <= limit:
            raise ValueError(f"a straggler cool-down of {cooldown:g}s up to {limit:g}s: expected 0 < cool-down "
                             "<= its limit")
        self.service, self.service_id = service, service_id
        self.cooldown, self.limit, self.clock = cooldown, limit, clock
        self.count = 0  # straggler drains of this instance since this agent started (or the reason's number)
        self.in_force: stragglers.Drain | None = None
        self._node: str | None = None
        self._looked = False  # looked once for a drain left by an earlier agent
        self._refusals: set[str] = set()

    @property
    def check_id(self) -> str:
        return api.maintenance_check_id(self.service_id)

    def tick(self, config: ConsulConfig, timeout: float) -> None:
        """Carry out a pending request, or lift a drain whose time has come.  Raises ConsulError but a 403."""
        try:
            if self._node is None:
                self._node = api.agent_node_name(config, timeout)
            key = stragglers.request_key(self.service, self._node, self.service_id)
            asked = api.kv_get(config, key, timeout)
            if asked is not None:
                self._carry_out(config, key, asked, timeout)
            elif self.in_force is not None or not self._looked:
                self._lift_if_due(config, timeout)
        except ConsulError as exc:
            if exc.status != 403:
                raise
            if str(exc) not in self._refusals:
                self._refusals.add(str(exc))
                log.warning("straggler drains: %s; this node neither carries out a job's request to drain it "
                            "nor lifts such a drain until the token allows", exc)

    def _maintenance_reason(self, config: ConsulConfig, timeout: float) -> str | None:
        """The reason of this instance's maintenance, None when it is not in maintenance."""
        check = api.agent_checks(config, timeout).get(self.check_id)
        return None if not isinstance(check, dict) else hosts.maintenance_reason(check)

    def _carry_out(self, config: ConsulConfig, key: str, asked: bytes, timeout: float) -> None:
        try:
            request = stragglers.Request.from_json(asked)
        except ValueError as exc:
            log.warning("straggler drains: key %s is not a job's request (%s); deleted", key, exc)
            api.kv_delete(config, key, timeout)
            return
        current = self._maintenance_reason(config, timeout)
        if current is not None:
            log.info("straggler drains: a job asks to drain this node (%s), but it is in maintenance already (%s)",
                     request.figures(), current)
        else:
            self.count += 1
            now = self.clock()
            drain = stragglers.Drain(self.count, int(now + stragglers.cooldown(self.cooldown, self.limit,
                                                                                self.count)))
            api.set_maintenance(config, self.service_id, True, drain.reason(request), timeout)
            self.in_force = drain
            log.warning("straggler drains: drained service id %r for the job: %s; readmitted in %.0f s",
                        self.service_id, request.figures(), drain.until - now)
        api.kv_delete(config, key, timeout)

    def _lift_if_due(self, config: ConsulConfig, timeout: float) -> None:
        reason = self._maintenance_reason(config, timeout)
        found = stragglers.parse_reason(reason or "")
        self._looked = True
        if found is None:  # not in maintenance, or an operator's: nothing of ours to lift
            if self.in_force is not None and reason is not None:
                log.info("straggler drains: service id %r was drained again by hand (%s): it stays out until "
                         "lifted by hand", self.service_id, reason)
            self.in_force = None
            return
        self.in_force = found
        self.count = max(self.count, found.count)
        if found.due(self.clock()):
            api.set_maintenance(config, self.service_id, False, None, timeout)
            self.in_force = None
            log.warning("straggler drains: readmitted service id %r after its cool-down (drain #%d)",
                        self.service_id, found.count)
