"""The catalog: nodes, service instances and health checks, shared by every node.

In Consul each agent syncs its local services and checks to the servers'
catalog; here every simulated agent writes straight into this one catalog.
Each write takes the next Raft index (see :mod:`.index`) and stamps the
topics a blocking query may wait on:

* ``nodes``, ``services``, ``checks``: whole tables (catalog listings,
  ``/v1/health/state``);
* ``service:<name>``: everything ``/v1/health/service/<name>`` shows, so its
  instances, their checks, and node-level checks (``serfHealth``, node
  maintenance) of nodes running it;
* ``node:<name>``: a node's own services and checks.

Nodes are of two kinds, as in Consul: a dev agent's own node (its tagged
addresses and meta come from the agent) and *external* nodes written through
``/v1/catalog/register``, which have no agent, hence no ``serfHealth``, and
carry exactly the tagged addresses and meta they were registered with.

JSON shapes follow Consul's ``api`` package field for field.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable

from hvd_elastic.gotypes import format_duration
from .index import RaftIndex

PASSING, WARNING, CRITICAL = "passing", "warning", "critical"
STATUSES = (PASSING, WARNING, CRITICAL)
SERF_CHECK_ID = "serfHealth"
NODE_MAINT_CHECK_ID = "_node_maintenance"
SERVICE_MAINT_PREFIX = "_service_maintenance:"


@dataclasses.dataclass
class Node:
    name: str
    id: str
    address: str
    datacenter: str
    create_index: int
    modify_index: int
    external: bool = False
    # An external node's own maps (None: Go's nil map, JSON null); an agent's node derives them.
    tagged_addresses: dict[str, str] | None = None
    meta: dict[str, str] | None = None

    def tagged_addresses_json(self) -> dict[str, str] | None:
        """Node tagged addresses: a map of strings (``lan``, ``wan``, ``lan_ipv4``, ...), never objects."""
        if self.external:
            return None if self.tagged_addresses is None else dict(self.tagged_addresses)
        addr = self.address
        family = "ipv6" if ":" in addr else "ipv4"
        return {"lan": addr, f"lan_{family}": addr, "wan": addr, f"wan_{family}": addr}

    def meta_json(self) -> dict[str, str] | None:
        if self.external:
            return None if self.meta is None else dict(self.meta)
        return {"consul-network-segment": ""}

    def to_json(self) -> dict:
        return {
            "ID": self.id,
            "Node": self.name,
            "Address": self.address,
            "Datacenter": self.datacenter,
            "TaggedAddresses": self.tagged_addresses_json(),
            "Meta": self.meta_json(),
            "CreateIndex": self.create_index,
            "ModifyIndex": self.modify_index,
        }


@dataclasses.dataclass
class Service:
    node: str
    id: str
    name: str
    tags: list[str]
    address: str
    port: int
    meta: dict[str, str]
    weights: dict[str, int]
    enable_tag_override: bool = False
    tagged_addresses: dict = dataclasses.field(default_factory=dict)
    create_index: int = 0
    modify_index: int = 0

    def same_definition(self, other: "Service") -> bool:
        fields = ("name", "tags", "address", "port", "meta", "weights", "enable_tag_override", "tagged_addresses")
        return all(getattr(self, f) == getattr(other, f) for f in fields)

    def agent_json(self, datacenter: str) -> dict:
        out = {
            "ID": self.id,
            "Service": self.name,
            "Tags": list(self.tags),
            "Meta": dict(self.meta),
            "Port": self.port,
            "Address": self.address,
            "Weights": dict(self.weights),
            "EnableTagOverride": self.enable_tag_override,
            "Datacenter": datacenter,
        }
        if self.tagged_addresses:
            out["TaggedAddresses"] = self.tagged_addresses
        return out

    def health_json(self) -> dict:
        out = {
            "ID": self.id,
            "Service": self.name,
            "Tags": list(self.tags),
            "Address": self.address,
            "Meta": dict(self.meta),
            "Port": self.port,
            "Weights": dict(self.weights),
            "EnableTagOverride": self.enable_tag_override,
            "Proxy": {"Mode": "", "MeshGateway": {}, "Expose": {}},
            "Connect": {},
            "PeerName": "",
            "CreateIndex": self.create_index,
            "ModifyIndex": self.modify_index,
        }
        if self.tagged_addresses:
            out["TaggedAddresses"] = self.tagged_addresses
        return out

    def catalog_json(self, node: Node) -> dict:
        n = node.to_json()
        return {
            "ID": n["ID"],
            "Node": n["Node"],
            "Address": n["Address"],
            "Datacenter": n["Datacenter"],
            "TaggedAddresses": n["TaggedAddresses"],
            "NodeMeta": n["Meta"],
            "ServiceKind": "",
            "ServiceID": self.id,
            "ServiceName": self.name,
            "ServiceTags": list(self.tags),
            "ServiceAddress": self.address,
            "ServiceWeights": dict(self.weights),
            "ServiceMeta": dict(self.meta),
            "ServicePort": self.port,
            "ServiceSocketPath": "",
            "ServiceEnableTagOverride": self.enable_tag_override,
            "ServiceProxy": {"Mode": "", "MeshGateway": {}, "Expose": {}},
            "ServiceConnect": {},
            "CreateIndex": self.create_index,
            "ModifyIndex": self.modify_index,
        }


@dataclasses.dataclass
class Check:
    node: str
    check_id: str
    name: str
    status: str
    notes: str = ""
    output: str = ""
    service_id: str = ""
    service_name: str = ""
    service_tags: list[str] = dataclasses.field(default_factory=list)
    type: str = ""
    interval_ns: int = 0
    timeout_ns: int = 0
    definition: dict = dataclasses.field(default_factory=dict)
    create_index: int = 0
    modify_index: int = 0
    # Monotonic time the check last turned critical (the reaper's clock).
    critical_since: float | None = None

    def to_json(self) -> dict:
        return {
            "Node": self.node,
            "CheckID": self.check_id,
            "Name": self.name,
            "Status": self.status,
            "Notes": self.notes,
            "Output": self.output,
            "ServiceID": self.service_id,
            "ServiceName": self.service_name,
            "ServiceTags": list(self.service_tags),
            "Type": self.type,
            "Interval": format_duration(self.interval_ns) if self.interval_ns else "",
            "Timeout": format_duration(self.timeout_ns) if self.timeout_ns else "",
            "ExposedPort": 0,
            "Definition": dict(self.definition),
            "CreateIndex": self.create_index,
            "ModifyIndex": self.modify_index,
        }


def _same_check(a: Check, b: Check) -> bool:
    skip = {"create_index", "modify_index", "critical_since"}
    return all(getattr(a, f.name) == getattr(b, f.name) for f in dataclasses.fields(Check) if f.name not in skip)


class Catalog:
    """All nodes, services and checks, with their indexes and change hooks."""

    def __init__(self, index: RaftIndex, datacenter: str = "dc1") -> None:
        self.index = index
        self.datacenter = datacenter
        self.nodes: dict[str, Node] = {}
        self.services: dict[str, dict[str, Service]] = {}
        self.checks: dict[str, dict[str, Check]] = {}
        self._by_name: dict[str, set[tuple[str, str]]] = {}
        # Called with (check, previous_status_or_None_if_removed) after a check
        # turns critical or is removed; sessions invalidate on both.
        self.on_check_lost: list[Callable[[Check], None]] = []
        # Called with a node's name after it was deregistered (its sessions go with it, as in Consul).
        self.on_node_removed: list[Callable[[str], None]] = []

    # -- topics -----------------------------------------------------------

    def _node_service_topics(self, node: str) -> set[str]:
        return {f"service:{s.name}" for s in self.services.get(node, {}).values()}

    def service_index(self, name: str) -> int:
        """Index for ``/v1/health/service/<name>`` and ``/v1/catalog/service/<name>``."""
        return self.index.of(f"service:{name}") or self.index.of("services")

    def service_topics(self, name: str) -> tuple[str, ...]:
        if self.index.of(f"service:{name}"):
            return (f"service:{name}",)
        return (f"service:{name}", "services")

    # -- nodes ------------------------------------------------------------

    def ensure_node(self, name: str, address: str) -> Node:
        node = self.nodes.get(name)
        if node is None:
            idx = self.index.bump("nodes", f"node:{name}")
            node = Node(name, str(uuid.uuid4()), address, self.datacenter, idx, idx)
            self.nodes[name] = node
            self.services.setdefault(name, {})
            self.checks.setdefault(name, {})
        return node

    def register_external(self, name: str, address: str, node_id: str | None,
                          tagged: dict[str, str] | None, meta: dict[str, str] | None) -> Node:
        """Create or update an external node (``/v1/catalog/register``); a write only on change."""
        node = self.nodes.get(name)
        if node is not None and not node.external:
            raise ValueError(f"node {name!r} belongs to a dev agent")
        if node is not None:
            wanted = (address, node.id if node_id is None else node_id, tagged, meta)
            if (node.address, node.id, node.tagged_addresses, node.meta) == wanted:
                return node
            node.address, node.id, node.tagged_addresses, node.meta = wanted
            node.modify_index = self.index.bump("nodes", f"node:{name}", *self._node_service_topics(name))
            return node
        idx = self.index.bump("nodes", f"node:{name}")
        node = Node(name, node_id or "", address, self.datacenter, idx, idx, external=True,
                    tagged_addresses=tagged, meta=meta)
        self.nodes[name] = node
        self.services[name] = {}
        self.checks[name] = {}
        return node

    def remove_node(self, name: str) -> bool:
        """Deregister a node with its services and checks (an unknown node is no error, as in Consul)."""
        if name not in self.nodes:
            return False
        for service_id in list(self.services[name]):
            self.remove_service(name, service_id)
        for check_id in list(self.checks[name]):
            self.remove_check(name, check_id)
        del self.nodes[name], self.services[name], self.checks[name]
        self.index.bump("nodes", f"node:{name}")
        for hook in self.on_node_removed:
            hook(name)
        return True

    # -- services ---------------------------------------------------------

    def upsert_service(self, svc: Service) -> Service:
        current = self.services[svc.node].get(svc.id)
        if current is not None and current.same_definition(svc):
            return current
        topics = {"services", f"node:{svc.node}", f"service:{svc.name}"}
        if current is not None:
            topics.add(f"service:{current.name}")
            self._by_name.get(current.name, set()).discard((svc.node, svc.id))
            svc.create_index = current.create_index
        idx = self.index.bump(*topics)
        if current is None:
            svc.create_index = idx
        svc.modify_index = idx
        self.services[svc.node][svc.id] = svc
        self._by_name.setdefault(svc.name, set()).add((svc.node, svc.id))
        return svc

    def remove_service(self, node: str, service_id: str) -> bool:
        svc = self.services.get(node, {}).get(service_id)
        if svc is None:
            return False
        for check in [c for c in self.checks[node].values() if c.service_id == service_id]:
            self.remove_check(node, check.check_id)
        del self.services[node][service_id]
        members = self._by_name.get(svc.name)
        if members is not None:
            members.discard((node, service_id))
            if not members:
                del self._by_name[svc.name]
        self.index.bump("services", f"node:{node}", f"service:{svc.name}")
        return True

    # -- checks -----------------------------------------------------------

    def _check_topics(self, check: Check) -> set[str]:
        topics = {"checks", f"node:{check.node}"}
        if check.service_id:
            topics.add(f"service:{check.service_name}")
        else:
            topics |= self._node_service_topics(check.node)
        return topics

    def upsert_check(self, check: Check) -> Check:
        current = self.checks[check.node].get(check.check_id)
        if current is not None and _same_check(current, check):
            return current  # Consul's anti-entropy sees nothing to sync: no write
        idx = self.index.bump(*self._check_topics(check))
        check.create_index = current.create_index if current is not None else idx
        check.modify_index = idx
        if check.status == CRITICAL:
            since = current.critical_since if current is not None and current.status == CRITICAL else None
            check.critical_since = since if since is not None else time.monotonic()
        self.checks[check.node][check.check_id] = check
        if check.status == CRITICAL and (current is None or current.status != CRITICAL):
            self._lost(check)
        return check

    def set_check_status(self, node: str, check_id: str, status: str, output: str) -> bool:
        """Record a check result; a write (and index bump) only when something changed."""
        check = self.checks.get(node, {}).get(check_id)
        if check is None:
            return False
        if check.status == status and check.output == output:
            return False
        was = check.status
        check.status, check.output = status, output
        if status == CRITICAL and was != CRITICAL:
            check.critical_since = time.monotonic()
        elif status != CRITICAL:
            check.critical_since = None
        check.modify_index = self.index.bump(*self._check_topics(check))
        if status == CRITICAL and was != CRITICAL:
            self._lost(check)
        return True

    def remove_check(self, node: str, check_id: str) -> Check | None:
        check = self.checks.get(node, {}).pop(check_id, None)
        if check is not None:
            self.index.bump(*self._check_topics(check))
            self._lost(check)
        return check

    def _lost(self, check: Check) -> None:
        for hook in self.on_check_lost:
            hook(check)

    # -- queries ----------------------------------------------------------

    def instances(self, name: str) -> list[tuple[Node, Service, list[Check]]]:
        """Every instance of service ``name`` with its node's and its own checks (in registration order)."""
        out = []
        by_node: dict[str, tuple[list, dict[str, list]]] = {}
        for node_name, sid in sorted(self._by_name.get(name, ())):
            node = self.nodes[node_name]
            svc = self.services[node_name][sid]
            if node_name not in by_node:
                by_node[node_name] = self._checks_by_owner(node_name)
            node_checks, service_checks = by_node[node_name]
            # Grouped once per node: scanning every check of the node per instance is quadratic,
            # seconds per answer for 10,000 instances on a few nodes.
            checks = [c for _, c in sorted(node_checks + service_checks.get(sid, []), key=lambda pc: pc[0])]
            out.append((node, svc, checks))
        return out

    def _checks_by_owner(self, node: str) -> tuple[list, dict[str, list]]:
        """([(position, node check)], {service id: [(position, check)]}) of ``node``'s checks."""
        node_checks: list = []
        service_checks: dict[str, list] = {}
        for position, check in enumerate(self.checks[node].values()):
            if check.service_id:
                service_checks.setdefault(check.service_id, []).append((position, check))
            else:
                node_checks.append((position, check))
        return node_checks, service_checks

    def service_names(self) -> dict[str, list[str]]:
        """``/v1/catalog/services``: name -> union of tags."""
        out: dict[str, list[str]] = {}
        for name, members in sorted(self._by_name.items()):
            tags: list[str] = []
            for node, sid in sorted(members):
                for tag in self.services[node][sid].tags:
                    if tag not in tags:
                        tags.append(tag)
            out[name] = tags
        return out

    def all_checks(self) -> list[Check]:
        return [c for node in sorted(self.checks) for _, c in sorted(self.checks[node].items())]
