"""``/v1/catalog/register`` and ``/v1/catalog/deregister``: external nodes, written straight to the catalog.

Consul's low-level catalog writes (its ``structs.RegisterRequest`` and
``DeregisterRequest``): a node with no agent, its services and its checks.
No agent runs such checks and no ``serfHealth`` watches such a node: their
status is whatever the last registration said, as for Consul's "external
services".  Validation follows Consul's ``Catalog.Register`` (same messages)
and everything is checked before anything is written, so a bad request
changes nothing.

Deliberate differences (each fails louder, never quieter):

* Consul answers these validation errors 500 (they come back from its RPC);
  the dev agent answers 400, as it does for invalid session settings;
* a dev agent's own node cannot be written here (400): on Consul that agent's
  anti-entropy would undo the write within a minute, which a test would only
  see as flakiness;
* a check naming another node than the request is refused even with ACLs off.
"""

from __future__ import annotations

import re
from typing import Any

from .local_agent import validate_service_meta
from .catalog import CRITICAL, STATUSES, Catalog, Check, Service
from .decode import (
    ANY, BOOL, INT, OBJECT, STRING, STRLIST, STRMAP, DecodeError, decode_service_addresses, decode_struct,
)
from .errors import HTTPError

REGISTER_FIELDS = {
    "ID": STRING, "Node": STRING, "Address": STRING, "Datacenter": STRING, "TaggedAddresses": STRMAP,
    "NodeMeta": STRMAP, "Service": OBJECT, "Check": OBJECT, "Checks": ANY, "SkipNodeUpdate": BOOL,
    "Partition": STRING, "Namespace": STRING,
}
NODE_SERVICE_FIELDS = {
    "Kind": STRING, "ID": STRING, "Service": STRING, "Tags": STRLIST, "Address": STRING, "TaggedAddresses": OBJECT,
    "Meta": STRMAP, "Port": INT, "Weights": OBJECT, "EnableTagOverride": BOOL, "Namespace": STRING,
    "Partition": STRING,
}
HEALTH_CHECK_FIELDS = {
    "Node": STRING, "CheckID": STRING, "Name": STRING, "Status": STRING, "Notes": STRING, "Output": STRING,
    "ServiceID": STRING, "ServiceName": STRING, "ServiceTags": STRLIST, "Type": STRING, "Definition": OBJECT,
    "Namespace": STRING, "Partition": STRING,
}
DEREGISTER_FIELDS = {"Node": STRING, "ServiceID": STRING, "CheckID": STRING, "Datacenter": STRING,
                     "Partition": STRING, "Namespace": STRING}
WEIGHTS_FIELDS = {"Passing": INT, "Warning": INT}
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def _bad(reason: str) -> HTTPError:
    return HTTPError(400, reason)


def _decode(raw: Any, struct: str, fields: dict[str, str]) -> dict:
    try:
        return decode_struct(raw, struct, fields)
    except DecodeError as exc:
        raise _bad(f"Request decode failed: {exc}") from None


def _check_datacenter(catalog: Catalog, given: str) -> None:
    if given and given != catalog.datacenter:
        raise HTTPError(500, "No path to datacenter")


def _check_enterprise(args: dict) -> None:
    for name in ("Namespace", "Partition"):
        if args.get(name) not in (None, "", "default"):
            raise _bad(f"Request decode failed: {name}s are a Consul Enterprise feature")


def _not_an_agent(agents: set[str], node: str) -> None:
    if node in agents:
        raise _bad(f"node {node!r} runs a dev agent: write its services and checks through its own "
                   "/v1/agent/* endpoints (Consul's anti-entropy would undo a catalog write)")


def _node_id(raw: str) -> str:
    # go-uuid's ParseUUID messages, which Consul wraps in "Bad node ID".
    if len(raw) != 36:
        raise _bad(f"Bad node ID: uuid string is wrong length: {raw!r}")
    if not _UUID.fullmatch(raw):
        raise _bad(f"Bad node ID: uuid is improperly formatted: {raw!r}")
    return raw.lower()


def _service(node: str, raw: Any) -> Service:
    args = _decode(raw, "NodeService", NODE_SERVICE_FIELDS)
    _check_enterprise(args)
    if args.get("Kind"):
        raise _bad(f"Request decode failed: service Kind {args['Kind']!r} "
                   "is not supported by the hvd-elastic dev agent")
    name = args.get("Service", "")
    service_id = args.get("ID") or name
    if service_id and not name:
        raise _bad("Must provide service name (Service.Service) when service ID is provided")
    if not service_id:
        raise _bad("Must provide service name (Service.Service)")
    address = args.get("Address", "")
    if address in ("0.0.0.0", "::", "[::]"):
        raise _bad("Invalid service address")
    port = args.get("Port", 0)
    if not 0 <= port <= 65535:
        raise _bad(f"Validation failed: invalid port {port} (expected 0..65535)")
    meta = args.get("Meta", {})
    validate_service_meta(meta)
    weights = {"Passing": 1, "Warning": 1}
    if "Weights" in args:
        given = _decode(args["Weights"], "Weights", WEIGHTS_FIELDS)
        weights = {"Passing": given.get("Passing", 0), "Warning": given.get("Warning", 0)}
    try:
        tagged = decode_service_addresses(args.get("TaggedAddresses", {}), "NodeService")
    except DecodeError as exc:
        raise _bad(f"Request decode failed: {exc}") from None
    return Service(node=node, id=service_id, name=name, tags=args.get("Tags", []), address=address, port=port,
                   meta=meta, weights=weights, enable_tag_override=args.get("EnableTagOverride", False),
                   tagged_addresses=tagged)


def _check(node: str, raw: Any, services: dict[str, Service]) -> Check:
    args = _decode(raw, "HealthCheck", HEALTH_CHECK_FIELDS)
    _check_enterprise(args)
    check_id = args.get("CheckID") or args.get("Name", "")
    check_node = args.get("Node") or node
    if check_node.lower() != node.lower():
        raise _bad(f"Node '{check_node}' for check '{check_id}' doesn't match register request node '{node}'")
    if not check_id:
        raise _bad("Missing check ID (give CheckID or Name)")
    status = args.get("Status") or CRITICAL  # Consul's state store stores a check without status as critical
    if status not in STATUSES:
        raise _bad(f"Bad check status {status!r} for check '{check_id}' (expected passing, warning or critical)")
    svc = None
    if args.get("ServiceID"):
        svc = services.get(args["ServiceID"])
        if svc is None:
            raise _bad(f"Unknown service ID '{args['ServiceID']}' for check ID '{check_id}'")
    return Check(node=node, check_id=check_id, name=args.get("Name", ""), status=status,
                 notes=args.get("Notes", ""), output=args.get("Output", ""),
                 service_id=svc.id if svc else "", service_name=svc.name if svc else "",
                 service_tags=list(svc.tags) if svc else [], type=args.get("Type", ""),
                 definition=dict(args.get("Definition", {})))


def _decode_request(catalog: Catalog, body: Any, struct: str, fields) -> tuple[dict, str]:
    """(decoded fields, node name) of a catalog write; the checks every such request passes first."""
    args = _decode(body, struct, fields)
    _check_datacenter(catalog, args.get("Datacenter", ""))
    _check_enterprise(args)
    node = args.get("Node", "")
    if not node:
        raise _bad("Must provide node")
    return args, node


def register(catalog: Catalog, agents: set[str], body: Any) -> None:
    """Apply a ``RegisterRequest`` body; raises :class:`HTTPError` and writes nothing when it is bad."""
    args, node = _decode_request(catalog, body, "RegisterRequest", REGISTER_FIELDS)
    node_id = _node_id(args["ID"]) if args.get("ID") else None
    address = args.get("Address", "")
    skip = args.get("SkipNodeUpdate", False)
    if not address and not skip:
        raise _bad("Must provide address if SkipNodeUpdate is not set")
    _not_an_agent(agents, node)
    if skip and node not in catalog.nodes:
        raise _bad(f"Missing node registration: SkipNodeUpdate is set and node {node!r} is not registered")

    services = dict(catalog.services.get(node, {}))
    svc = _service(node, args["Service"]) if args.get("Service") else None
    if svc is not None:
        services[svc.id] = svc
    raw_checks = args.get("Checks") or []
    if not isinstance(raw_checks, list):
        raise _bad("Request decode failed: json: cannot unmarshal "
                   f"{type(raw_checks).__name__} into Go struct field RegisterRequest.Checks "
                   "of type structs.HealthChecks")
    checks = [_check(node, c, services) for c in ([args["Check"]] if args.get("Check") else []) + raw_checks]

    # Everything is valid: write (one event-loop step, so no reader sees half of it).
    if not skip:
        catalog.register_external(node, address, node_id, args.get("TaggedAddresses"), args.get("NodeMeta"))
    if svc is not None:
        catalog.upsert_service(svc)
    for check in checks:
        catalog.upsert_check(check)


def deregister(catalog: Catalog, agents: set[str], body: Any) -> None:
    """Apply a ``DeregisterRequest``: the service (with its checks), else the check, else the whole node.

    An unknown node, service or check is no error, as in Consul.
    """
    args, node = _decode_request(catalog, body, "DeregisterRequest", DEREGISTER_FIELDS)
    _not_an_agent(agents, node)
    if args.get("ServiceID"):
        catalog.remove_service(node, args["ServiceID"])
    elif args.get("CheckID"):
        catalog.remove_check(node, args["CheckID"])
    else:
        catalog.remove_node(node)
