"""``/v1/health/*`` and ``/v1/catalog/*``: blocking reads of the shared catalog."""

from __future__ import annotations

from ..catalog import PASSING, STATUSES
from ..errors import HTTPError
from .agent import CHECK_FIELDS, apply_filter
from .base import Context, blocking, json_response, route

HEALTH_FIELDS = {"Node", "Service", "Checks"}
NODE_FIELDS = {"ID", "Node", "Address", "Datacenter", "TaggedAddresses", "Meta"}
CATALOG_SERVICE_FIELDS = {
    "ID", "Node", "Address", "Datacenter", "TaggedAddresses", "NodeMeta", "ServiceKind", "ServiceID",
    "ServiceName", "ServiceTags", "ServiceAddress", "ServiceWeights", "ServiceMeta", "ServicePort",
    "ServiceEnableTagOverride",
}


def _name(ctx: Context, what: str) -> str:
    if not ctx.tail:
        raise HTTPError(400, f"Missing {what}")
    return ctx.tail


def _tag_match(tags: list[str], wanted: list[str]) -> bool:
    # Consul compares tags case-insensitively and requires every ?tag= given.
    lowered = {t.lower() for t in tags}
    return all(w.lower() in lowered for w in wanted)


def _node_meta_match(ctx: Context) -> bool:
    # Every simulated node has only Consul's built-in segment meta.
    for pair in ctx.req.query.get("node-meta", []):
        key, _, value = pair.partition(":")
        if key != "consul-network-segment" or value != "":
            return False
    return True


def _passing_arg(ctx: Context) -> bool:
    if not ctx.req.has("passing"):
        return False
    if ctx.req.arg("passing") == "":
        return True
    try:
        return ctx.bool_arg("passing")
    except HTTPError:
        raise HTTPError(400, "Invalid value for ?passing") from None


@route("/v1/health/service/", ("GET",), acl="service:read", anonymous_empty=[])
async def health_service(ctx: Context):
    name = _name(ctx, "service name")
    catalog = ctx.cluster.catalog
    passing = _passing_arg(ctx)
    tags = ctx.req.query.get("tag", [])

    def render():
        rows = []
        if not _node_meta_match(ctx):
            return rows
        for node, svc, checks in catalog.instances(name):
            if tags and not _tag_match(svc.tags, tags):
                continue
            if passing and any(c.status != PASSING for c in checks):
                continue
            rows.append({
                "Node": node.to_json(),
                "Service": svc.health_json(),
                "Checks": [c.to_json() for c in checks],
            })
        return apply_filter(ctx, rows, HEALTH_FIELDS)

    apply_filter(ctx, [], HEALTH_FIELDS)  # a bad expression is a 400 before any wait
    return await blocking(ctx, catalog.service_topics(name), lambda: catalog.service_index(name), render,
                          cacheable=True)


@route("/v1/health/checks/", ("GET",), acl="service:read", anonymous_empty=[])
async def health_checks(ctx: Context):
    name = _name(ctx, "service name")
    catalog = ctx.cluster.catalog

    def render():
        rows = [c.to_json() for _, _, checks in catalog.instances(name) for c in checks if c.service_id]
        return apply_filter(ctx, rows, CHECK_FIELDS)

    return await blocking(ctx, catalog.service_topics(name), lambda: catalog.service_index(name), render)


@route("/v1/health/node/", ("GET",), acl="node:read", anonymous_empty=[])
async def health_node(ctx: Context):
    node = _name(ctx, "node name")
    catalog = ctx.cluster.catalog
    index = ctx.cluster.index

    def render():
        return [c.to_json() for _, c in sorted(catalog.checks.get(node, {}).items())]

    return await blocking(ctx, (f"node:{node}",), lambda: index.of(f"node:{node}") or index.of("checks"), render)


@route("/v1/health/state/", ("GET",), acl="node:read", anonymous_empty=[])
async def health_state(ctx: Context):
    state = _name(ctx, "check state")
    if state != "any" and state not in STATUSES:
        raise HTTPError(400, f"Invalid check state {state!r} (expected any, passing, warning or critical)")
    catalog = ctx.cluster.catalog
    index = ctx.cluster.index

    def render():
        rows = [c.to_json() for c in catalog.all_checks() if state == "any" or c.status == state]
        return apply_filter(ctx, rows, CHECK_FIELDS)

    return await blocking(ctx, ("checks",), lambda: index.of("checks"), render)


@route("/v1/catalog/services", ("GET",), acl="service:read", anonymous_empty={})
async def catalog_services(ctx: Context):
    catalog = ctx.cluster.catalog
    index = ctx.cluster.index
    return await blocking(ctx, ("services",), lambda: index.of("services"), catalog.service_names)


@route("/v1/catalog/service/", ("GET",), acl="service:read", anonymous_empty=[])
async def catalog_service(ctx: Context):
    name = _name(ctx, "service name")
    catalog = ctx.cluster.catalog
    tags = ctx.req.query.get("tag", [])

    def render():
        rows = [svc.catalog_json(node) for node, svc, _ in catalog.instances(name)
                if not tags or _tag_match(svc.tags, tags)]
        return apply_filter(ctx, rows, CATALOG_SERVICE_FIELDS)

    return await blocking(ctx, catalog.service_topics(name), lambda: catalog.service_index(name), render,
                          cacheable=True)


@route("/v1/catalog/nodes", ("GET",), acl="node:read", anonymous_empty=[])
async def catalog_nodes(ctx: Context):
    catalog = ctx.cluster.catalog
    index = ctx.cluster.index

    def render():
        rows = [n.to_json() for _, n in sorted(catalog.nodes.items())]
        return apply_filter(ctx, rows, NODE_FIELDS)

    return await blocking(ctx, ("nodes",), lambda: index.of("nodes"), render)


@route("/v1/catalog/datacenters", ("GET",))
async def catalog_datacenters(ctx: Context):
    return json_response([ctx.cluster.datacenter])
