"""The node agent's metrics: its registration, TTL updates, probes, maintenance state and Consul errors.

Updated from the agent's loop (one tick every ``interval``) and read at scrape
time, so a scrape never waits for Consul or a probe.  ``consul_error_kind``
names the ``kind`` label of every Consul failure; the discovery watcher uses it too.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from hvd_elastic.consul.errors import ConsulError, ConsulTimeout

STATUSES = ("passing", "warning", "critical")
ERROR_KINDS = ("unreachable", "timeout", "acl", "server", "client", "config")


def consul_error_kind(exc: BaseException) -> str:
    """``unreachable``, ``timeout``, ``acl`` (403), ``server`` (5xx), ``client`` (other 4xx) or ``config``."""
    if isinstance(exc, ConsulTimeout):
        return "timeout"
    if not isinstance(exc, ConsulError):
        return "config"  # a bad token file, TLS files: nothing reached Consul
    if exc.status is None:
        return "unreachable"
    if exc.status == 403:
        return "acl"
    return "server" if exc.status >= 500 else "client"


class NodeAgentMetrics:
    """Series of one node agent, in a registry of their own (:attr:`registry`).

    No identity label: each agent is its own scrape target, and Prometheus's
    ``consul_sd_configs`` adds the node and service ID (README's ``prometheus.yml``).
    """

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.registered = Gauge("hvd_elastic_node_registered", "1 while the service is registered in Consul.",
                                registry=r)
        self.registrations = Counter("hvd_elastic_node_registrations", "Registrations of the service (re-registrations "
                                     "after a Consul agent restart included).", registry=r)
        ttl = Counter("hvd_elastic_node_ttl_updates", "TTL check updates sent, by outcome.", ["outcome"], registry=r)
        self.ttl = {outcome: ttl.labels(outcome=outcome) for outcome in ("ok", "error")}
        self.health = Gauge("hvd_elastic_node_health", "1 for the status the node reports now (the worst probe).",
                            ["status"], registry=r)
        self.probe_status = Gauge("hvd_elastic_node_probe_status", "1 for each probe's last status.",
                                  ["probe", "status"], registry=r)
        self.probe_seconds = Gauge("hvd_elastic_node_probe_duration_seconds", "How long each probe's last run took.",
                                   ["probe"], registry=r)
        # A labelled child is exported only once set: absent until the agent has read it.
        self.maintenance = Gauge("hvd_elastic_node_maintenance", "1 while the service is drained (Consul "
                                 "maintenance mode).", ["service_id"], registry=r)
        errors = Counter("hvd_elastic_node_consul_errors", "Consul requests that failed, by kind.", ["kind"],
                         registry=r)
        self.errors = {kind: errors.labels(kind=kind) for kind in ERROR_KINDS}
        _one_of(self.health, None)

    def on_health(self, status: str) -> None:
        _one_of(self.health, status)

    def on_probe(self, name: str, status: str, seconds: float) -> None:
        _one_of(self.probe_status, status, probe=name)
        self.probe_seconds.labels(probe=name).set(seconds)

    def on_maintenance(self, service_id: str, drained: bool) -> None:
        self.maintenance.labels(service_id=service_id).set(1 if drained else 0)

    def on_consul_error(self, exc: BaseException) -> None:
        self.errors[consul_error_kind(exc)].inc()


def _one_of(gauge: Gauge, status: str | None, **labels: str) -> None:
    """A state set: 1 for ``status``, 0 for every other of :data:`STATUSES`."""
    for known in STATUSES:
        gauge.labels(**labels, status=known).set(1 if known == status else 0)
