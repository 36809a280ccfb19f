"""One node's local agent: its services, checks, check runners and liveness.

A Consul client agent owns the services and checks registered through its
own HTTP port, runs their checks, and is itself watched by the cluster
through the node's ``serfHealth`` check.  :class:`LocalAgent` does the same
against the shared :class:`~.catalog.Catalog`.  Stopping an agent (the node
dies) turns ``serfHealth`` critical and freezes its checks; starting it again
(a restarted agent restoring its persisted state) resumes them.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import time

from hvd_elastic.gotypes import format_duration

from . import checks as checks_mod
from .catalog import (
    CRITICAL,
    NODE_MAINT_CHECK_ID,
    PASSING,
    SERF_CHECK_ID,
    SERVICE_MAINT_PREFIX,
    Catalog,
    Check,
    Service,
)
from .decode import decode_service
from .errors import HTTPError

log = logging.getLogger(__name__)

DEFAULT_NODE_MAINT_REASON = (
    "Maintenance mode is enabled for this node, but no reason was provided. This is a default message."
)
DEFAULT_SERVICE_MAINT_REASON = (
    "Maintenance mode is enabled for this service, but no reason was provided. This is a default message."
)
_META_KEY_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


@dataclasses.dataclass(frozen=True)
class ReaperSettings:
    """Consul's ``check_reap_interval`` and ``check_deregister_interval_min`` (seconds)."""

    interval: float = 30.0
    deregister_min: float = 60.0


def validate_service_meta(meta: dict[str, str]) -> None:
    """Consul's ``structs.ValidateServiceMetadata``: a 400 naming the bad pair."""
    if len(meta) > 64:
        raise HTTPError(400, "Invalid Service Meta: Reached maximum metadata pairs (limit: 64)")
    for key, value in meta.items():
        pair = f"Couldn't load metadata pair ('{key}', '{value}')"
        if not key:
            raise HTTPError(400, f"Invalid Service Meta: {pair}: Key cannot be blank")
        if len(key) > 128:
            raise HTTPError(400, f"Invalid Service Meta: {pair}: Key is too long (limit: 128 characters)")
        if not set(key) <= _META_KEY_CHARS:
            raise HTTPError(400, f"Invalid Service Meta: {pair}: Key contains invalid characters")
        if key.startswith("consul-"):
            raise HTTPError(400, f"Invalid Service Meta: {pair}: Key prefix 'consul-' is reserved for internal use")
        if len(value) > 512:
            raise HTTPError(400, f"Invalid Service Meta: {pair}: Value is too long (limit: 512 characters)")


def _tagged_addresses(given: dict, address: str, port: int) -> dict:
    # Consul's addServiceInternal fills lan/wan tagged addresses from an IP Address.
    out = dict(given)
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return out
    suffix = "ipv4" if ip.version == 4 else "ipv6"
    for kind in ("lan", "wan"):
        out.setdefault(f"{kind}_{suffix}", {"Address": address, "Port": port})
    return out


def _definition_json(defn: dict) -> dict:
    out = {}
    for name in ("HTTP", "TLSServerName", "TLSSkipVerify", "Header", "Method", "Body", "TCP"):
        if defn.get(name):
            out[name] = defn[name]
    for name in ("Interval", "Timeout", "TTL", "DeregisterCriticalServiceAfter"):
        if defn.get(name):
            out[name] = format_duration(defn[name])
    return out


class LocalAgent:
    """The agent of one node; every method runs on the event loop thread."""

    def __init__(self, node: str, address: str, catalog: Catalog, reaper: ReaperSettings) -> None:
        self.node = node
        self.address = address
        self.catalog = catalog
        self.reaper = reaper
        self.running = False
        self._runners: dict[str, checks_mod.CheckRunner] = {}
        self._definitions: dict[str, dict] = {}  # check id -> decoded check definition
        catalog.ensure_node(node, address)

    # -- liveness ---------------------------------------------------------

    def start(self) -> None:
        self.running = True
        self._set_serf(PASSING, "Agent alive and reachable")
        for runner in self._runners.values():
            runner.start()

    def stop(self) -> None:
        self.running = False
        for runner in self._runners.values():
            runner.stop()
        self._set_serf(CRITICAL, "Agent not live or unreachable")

    def _set_serf(self, status: str, output: str) -> None:
        if SERF_CHECK_ID in self.catalog.checks[self.node]:
            self.catalog.set_check_status(self.node, SERF_CHECK_ID, status, output)
        else:
            self.catalog.upsert_check(
                Check(self.node, SERF_CHECK_ID, "Serf Health Status", status, output=output)
            )

    # -- services ---------------------------------------------------------

    def register_service(self, body: object, replace_existing_checks: bool) -> None:
        """``PUT /v1/agent/service/register`` with an already JSON-decoded body."""
        try:
            args = decode_service(body)
        except ValueError as exc:
            raise HTTPError(400, f"Request decode failed: {exc}") from None
        name = args.get("Name", "")
        if not name:
            raise HTTPError(400, "Missing service name")
        address = args.get("Address", "")
        if address in ("0.0.0.0", "::", "[::]"):
            raise HTTPError(400, "Invalid service address")
        weights = {"Passing": 1, "Warning": 1}
        if "Weights" in args:
            weights = {"Passing": args["Weights"].get("Passing", 0), "Warning": args["Weights"].get("Warning", 0)}
            if weights["Passing"] < 1:
                raise HTTPError(400, "Invalid Weights: Passing must be greater than 0")
            if weights["Warning"] < 0:
                raise HTTPError(400, "Invalid Weights: Warning must be greater or equal than 0")
        meta = args.get("Meta", {})
        validate_service_meta(meta)
        port = args.get("Port", 0)
        if not 0 <= port <= 65535:
            raise HTTPError(400, f"Validation failed: invalid port {port} (expected 0..65535)")
        check_defs = ([args["Check"]] if args.get("Check") else []) + [c for c in args.get("Checks", []) if c]
        for defn in check_defs:
            try:
                checks_mod.validate(defn)
            except checks_mod.StatusError as exc:
                raise HTTPError(400, str(exc)) from None
            except ValueError as exc:
                raise HTTPError(400, f"Invalid check: {exc}") from None
        svc = Service(
            node=self.node,
            id=args.get("ID") or name,
            name=name,
            tags=args.get("Tags", []),
            address=address,
            port=port,
            meta=meta,
            weights=weights,
            enable_tag_override=args.get("EnableTagOverride", False),
            tagged_addresses=_tagged_addresses(args.get("TaggedAddresses", {}), address, port),
        )
        self.catalog.upsert_service(svc)
        kept = set()
        for i, defn in enumerate(check_defs):
            check_id = defn.get("CheckID") or (
                f"service:{svc.id}" + (f":{i + 1}" if len(check_defs) > 1 else "")
            )
            kept.add(check_id)
            self._add_check(check_id, defn, svc)
        if replace_existing_checks:
            for check in list(self.catalog.checks[self.node].values()):
                if check.service_id == svc.id and check.check_id not in kept and check.type != "maintenance":
                    self._remove_check(check.check_id)

    def _add_check(self, check_id: str, defn: dict, svc: Service | None) -> None:
        kind = checks_mod.check_type(defn)
        # A re-registered check keeps its current status and output (Consul
        # restores them from its snapshot of the local checks).
        previous = self.catalog.checks[self.node].get(check_id)
        check = Check(
            node=self.node,
            check_id=check_id,
            name=defn.get("Name") or (f"Service '{svc.name}' check" if svc else check_id),
            status=previous.status if previous else defn.get("Status") or CRITICAL,
            output=previous.output if previous else "",
            notes=defn.get("Notes", ""),
            service_id=svc.id if svc else "",
            service_name=svc.name if svc else "",
            service_tags=list(svc.tags) if svc else [],
            type=kind,
            interval_ns=defn.get("Interval", 0),
            timeout_ns=defn.get("Timeout", 0),
            definition=_definition_json(defn),
        )
        old = self._runners.pop(check_id, None)
        if old is not None:
            old.stop()
        self.catalog.upsert_check(check)
        self._definitions[check_id] = defn
        runner = checks_mod.RUNNERS[kind](defn, self._reporter(check_id))
        self._runners[check_id] = runner
        if self.running:
            runner.start()

    def _reporter(self, check_id: str):
        def report(status: str, output: str) -> None:
            self.catalog.set_check_status(self.node, check_id, status, output)

        return report

    def _remove_check(self, check_id: str) -> None:
        runner = self._runners.pop(check_id, None)
        if runner is not None:
            runner.stop()
        self._definitions.pop(check_id, None)
        self.catalog.remove_check(self.node, check_id)

    def deregister_service(self, service_id: str) -> None:
        """``PUT /v1/agent/service/deregister/:id``; an unknown id is no error (as in Consul)."""
        for check in list(self.catalog.checks[self.node].values()):
            if check.service_id == service_id:
                self._remove_check(check.check_id)
        self.catalog.remove_service(self.node, service_id)

    def register_check(self, defn: dict) -> None:
        """``PUT /v1/agent/check/register`` with a decoded CheckDefinition."""
        svc = None
        if defn.get("ServiceID"):
            svc = self.catalog.services[self.node].get(defn["ServiceID"])
            if svc is None:
                raise HTTPError(404, f'ServiceID "{defn["ServiceID"]}" does not exist')
        self._add_check(defn.get("CheckID") or defn["Name"], defn, svc)

    def local_checks(self) -> dict[str, Check]:
        """This agent's own checks (``/v1/agent/checks``): those it runs and its maintenance checks."""
        return {cid: c for cid, c in self.catalog.checks[self.node].items()
                if cid in self._definitions or c.type == "maintenance"}

    def deregister_check(self, check_id: str) -> None:
        self._remove_check(check_id)

    # -- TTL updates and maintenance --------------------------------------

    def update_ttl(self, check_id: str, status: str, output: str) -> None:
        runner = self._runners.get(check_id)
        if not isinstance(runner, checks_mod.TTLRunner):
            raise HTTPError(500, f'CheckID "{check_id}" does not have associated TTL')
        runner.update(status, output)

    def service_maintenance(self, service_id: str, enable: bool, reason: str) -> None:
        svc = self.catalog.services[self.node].get(service_id)
        if svc is None:
            raise HTTPError(404, f'No service registered with ID "{service_id}"')
        check_id = SERVICE_MAINT_PREFIX + service_id
        present = check_id in self.catalog.checks[self.node]
        if enable and not present:
            self.catalog.upsert_check(Check(
                self.node, check_id, "Service Maintenance Mode", CRITICAL,
                notes=reason or DEFAULT_SERVICE_MAINT_REASON, service_id=svc.id,
                service_name=svc.name, service_tags=list(svc.tags), type="maintenance",
            ))
        elif not enable and present:
            self.catalog.remove_check(self.node, check_id)

    def node_maintenance(self, enable: bool, reason: str) -> None:
        present = NODE_MAINT_CHECK_ID in self.catalog.checks[self.node]
        if enable and not present:
            self.catalog.upsert_check(Check(
                self.node, NODE_MAINT_CHECK_ID, "Node Maintenance Mode", CRITICAL,
                notes=reason or DEFAULT_NODE_MAINT_REASON, type="maintenance",
            ))
        elif not enable and present:
            self.catalog.remove_check(self.node, NODE_MAINT_CHECK_ID)

    # -- reaping ----------------------------------------------------------

    def reap(self) -> list[str]:
        """Deregister services whose check has been critical past DeregisterCriticalServiceAfter."""
        if not self.running:
            return []  # the reaper is part of the (dead) local agent
        now = time.monotonic()
        reaped = []
        for check_id, defn in list(self._definitions.items()):
            after = defn.get("DeregisterCriticalServiceAfter", 0)
            check = self.catalog.checks[self.node].get(check_id)
            if not after or check is None or not check.service_id or check.critical_since is None:
                continue
            timeout = max(after / 1e9, self.reaper.deregister_min)
            if now - check.critical_since > timeout and check.service_id not in reaped:
                log.info("reaping service %s on %s: check %s critical for over %.0fs",
                         check.service_id, self.node, check_id, timeout)
                reaped.append(check.service_id)
                self.deregister_service(check.service_id)
        return reaped
