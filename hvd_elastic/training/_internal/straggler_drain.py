"""Straggler policy ``drain``: rank 0 asks the slow host's node agent, through Consul, to drain it.

A drained host leaves the job gracefully (horovodrun removes it at the next
reset, the survivors keep their state: no rollback) and its node agent lifts
the drain after a cool-down, so it rejoins and is measured again
(:mod:`hvd_elastic.nodeagent.straggler_drain`).  The request is a KV key per
slow service instance (:mod:`hvd_elastic.health.stragglers`): only a node's own
Consul agent can put its service in maintenance.

Limits, checked by rank 0 when a host becomes a straggler
(:meth:`Drainer.drain`; no collective, the other ranks only report):

* one host per window: the slowest of those that became stragglers in it;
  and none while an earlier request waits for its host to leave (until the
  next world);
* never below horovodrun's ``--min-np``: the ranks left without the host must
  be at least that many.  It is read from horovodrun's driver rules
  (:data:`hvd_elastic.horovodrun.WORLD_PATH`); a horovodrun without them
  cannot say, and then nothing is drained (one warning);
* never the only host of the world (every host does the same work in a
  data-parallel job, so the only host is the only one of its kind);
* a Consul that refuses the request (403: the token lacks ``key:write`` on
  the prefix) is one warning, and this process only reports from then on.

Consul's settings are discovery's, read from the environment horovodrun copies
to every worker (as the health cut reads them: ``CONSUL_HTTP_ADDR``,
``CONSUL_HTTP_TOKEN_FILE``, ``HVD_ELASTIC_SERVICE``, ``HVD_ELASTIC_HOST_NAME``
...), so the host name the job knows maps to the Consul node and service ID
through the same health read and naming discovery prints.  Each call is bounded
by discovery's timeout; it happens once per straggler, never per step.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from hvd_elastic.consul.config import ConfigError
from hvd_elastic.consul.errors import ConsulError
from hvd_elastic.health import stragglers
from hvd_elastic.training._internal import pace, rendezvous

log = logging.getLogger("hvd_elastic.training")

REQUESTED, SKIPPED, REFUSED, FAILED = "requested", "skipped", "refused", "failed"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What became of one host's drain: ``status`` (one of the four above), why, and the instances asked."""

    host: str
    status: str
    why: str
    instances: tuple[str, ...] = ()  # "node/service id"


def choose(reached: Sequence[pace.HostPace]) -> pace.HostPace | None:
    """The one host to drain this window: the slowest of those that became stragglers in it."""
    return max(reached, key=lambda host: (host.ratio, host.host), default=None)


def limit(host: pace.HostPace, size: int, hosts: int, min_np: int | None) -> str | None:
    """Why ``host`` (``host.ranks`` of the world's ``size`` ranks, on ``hosts`` hosts) may not be drained; None:
    it may."""
    if hosts < 2:
        return "it is the only host of the job"
    if min_np is None:
        return "horovodrun's --min-np is unknown (a horovodrun without hvd-elastic's driver rules)"
    if size - host.ranks < min_np:
        return f"the job would keep {size - host.ranks} of {size} ranks, below --min-np {min_np}"
    return None


class Drainer:
    """Rank 0's drains for one run (see the module docstring).  The collaborators are parameters for tests."""

    def __init__(self, server: Callable[[], Any] = rendezvous.Server.from_env,
                 discovery: Callable[[], Any] | None = None) -> None:
        self._server = server
        self._discovery = discovery
        self.pending: str | None = None  # the host asked for, until the next world
        self.refused: str | None = None  # Consul's refusal: reports only from then on

    def new_world(self) -> None:
        """A reset formed a new world: the host asked for has left it (or the request lapsed)."""
        self.pending = None

    def drain(self, host: pace.HostPace, job_median_s: float, size: int, hosts: int,
              policy: pace.PacePolicy) -> Outcome:
        """Ask for ``host``'s drain within the limits; never raises for Consul or the driver."""
        if self.refused is not None:
            return Outcome(host.host, SKIPPED, f"Consul refused an earlier request ({self.refused})")
        if self.pending is not None:
            return Outcome(host.host, SKIPPED, f"the drain of {self.pending} asked for earlier is still under way")
        why = limit(host, size, hosts, self._min_np())
        if why is not None:
            return Outcome(host.host, SKIPPED, why)
        request = stragglers.Request(host.host, round(host.ratio, 3), host.seconds, job_median_s, policy.windows,
                                     policy.window)
        try:
            instances = self._ask(request)
        except ConsulError as exc:
            if exc.status == 403:
                self.refused = str(exc)
                return Outcome(host.host, REFUSED, str(exc))
            return Outcome(host.host, FAILED, str(exc))
        except ConfigError as exc:
            return Outcome(host.host, FAILED, str(exc))
        if not instances:
            return Outcome(host.host, FAILED, f"Consul lists no instance of the service on host {host.host}")
        self.pending = host.host
        return Outcome(host.host, REQUESTED, request.figures(), tuple(instances))

    def _min_np(self) -> int | None:
        server = self._server()
        if server is None:
            return None
        try:
            world = server.world()
        except rendezvous.ERRORS as exc:
            log.debug("could not read --min-np from horovodrun's driver: %s", exc)
            return None
        return None if world is None else world.min_np

    def _ask(self, request: stragglers.Request) -> list[str]:
        """Write the request for every instance of the service on the host; their ``node/service id``."""
        from hvd_elastic.consul import api
        from hvd_elastic.health import hosts as hostlib, query, variables

        found = (self._discovery or variables.from_environment)()
        entries, _ = query.read_health(found.config, found.query, passing=False, timeout=found.timeout)
        asked = []
        for decision in hostlib.evaluate(entries, found.options):
            if decision.host == request.host:
                key = stragglers.request_key(found.query.service, decision.node, decision.service_id)
                api.kv_put(found.config, key, request.fields(), timeout=found.timeout)
                asked.append(f"{decision.node}/{decision.service_id}")
        return asked
