"""``/v1/health/*`` and ``/v1/catalog/*``: blocking reads of the shared catalog.

Every listing takes ``?filter=`` (a bad expression is a 400 before any wait)
and, for a restricted ACL token, drops the rows it may not read after the
filter, as Consul does (so ``X-Consul-Results-Filtered-By-ACLs`` never counts
rows the filter removed anyway).
"""

from __future__ import annotations

from .. import acl
from ..catalog import PASSING, STATUSES
from ..errors import HTTPError
from .agent import CHECK_FIELDS, apply_filter, validate_filter
from .base import Context, blocking, json_bytes, json_response, route

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


def _node_meta_match(ctx: Context, node) -> bool:
    # Every ?node-meta=key:value given must be in the node's meta.
    meta = node.meta_json() or {}
    for pair in ctx.req.query.get("node-meta", []):
        key, _, value = pair.partition(":")
        if meta.get(key) != value:
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

    def selected():
        for node, svc, checks in catalog.instances(name):
            if not _node_meta_match(ctx, node):
                continue
            if tags and not _tag_match(svc.tags, tags):
                continue
            if passing and any(c.status != PASSING for c in checks):
                continue
            yield node, svc, checks

    def render():
        if ctx.req.arg("filter") or not ctx.authz.management:
            rows = [_health_row(node, svc, checks) for node, svc, checks in selected()]
            return ctx.keep_readable(apply_filter(ctx, rows, HEALTH_FIELDS), acl.health_row_readable)
        return _encoded_rows(ctx.cluster.health_row_cache, selected(), catalog)

    validate_filter(ctx, HEALTH_FIELDS)
    return await blocking(ctx, catalog.service_topics(name), lambda: catalog.service_index(name), render,
                          cacheable=True)


def _health_row(node, svc, checks) -> dict:
    return {"Node": node.to_json(), "Service": svc.health_json(), "Checks": [c.to_json() for c in checks]}


def _encoded_rows(row_cache: dict, instances, catalog) -> bytes:
    """The JSON array of health rows, re-encoding only the rows whose objects changed.

    A blocking query woken by one change among 10,000 instances would
    otherwise rebuild and encode all 10,000 rows (seconds on a small machine)
    for every change.  A row is keyed by the identity and modify index of its
    node, service and checks: every write to any of them takes a new index.
    The bytes equal ``json_bytes`` of the whole list.
    """
    parts, used = [], {}
    for node, svc, checks in instances:
        key = (id(node), node.modify_index, id(svc), svc.modify_index, tuple((id(c), c.modify_index) for c in checks))
        where = (node.name, svc.id)
        hit = row_cache.get(where)
        if hit is None or hit[0] != key:
            hit = (key, json_bytes(_health_row(node, svc, checks)))
        used[where] = hit
        parts.append(hit[1])
    row_cache.update(used)
    if len(row_cache) > 2 * len(used) + 64:  # rows of deregistered instances: keep the cache bounded
        for node_name, sid in [k for k in row_cache if k[1] not in catalog.services.get(k[0], {})]:
            del row_cache[(node_name, sid)]
    return b"[" + b",".join(parts) + b"]"


@route("/v1/health/checks/", ("GET",), acl="service:read", anonymous_empty=[])
async def health_checks(ctx: Context):
    name = _name(ctx, "service name")
    catalog = ctx.cluster.catalog

    def render():
        rows = [c.to_json() for _, _, checks in catalog.instances(name) for c in checks if c.service_id]
        return ctx.keep_readable(apply_filter(ctx, rows, CHECK_FIELDS), acl.check_readable)

    validate_filter(ctx, CHECK_FIELDS)
    return await blocking(ctx, catalog.service_topics(name), lambda: catalog.service_index(name), render)


@route("/v1/health/node/", ("GET",), acl="node:read", anonymous_empty=[])
async def health_node(ctx: Context):
    node = _name(ctx, "node name")
    catalog = ctx.cluster.catalog
    index = ctx.cluster.index

    def render():
        rows = [c.to_json() for _, c in sorted(catalog.checks.get(node, {}).items())]
        return ctx.keep_readable(apply_filter(ctx, rows, CHECK_FIELDS), acl.check_readable)

    validate_filter(ctx, CHECK_FIELDS)
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
        return ctx.keep_readable(apply_filter(ctx, rows, CHECK_FIELDS), acl.check_readable)

    validate_filter(ctx, CHECK_FIELDS)
    return await blocking(ctx, ("checks",), lambda: index.of("checks"), render)


@route("/v1/catalog/services", ("GET",), acl="service:read", anonymous_empty={})
async def catalog_services(ctx: Context):
    catalog = ctx.cluster.catalog
    index = ctx.cluster.index

    def render():
        if not ctx.req.arg("filter"):
            return _readable_names(ctx, catalog.service_names())
        # Consul filters the service instances (CatalogService rows), then lists the names left.
        names: dict[str, list[str]] = {}
        for name in catalog.service_names():
            rows = [svc.catalog_json(node) for node, svc, _ in catalog.instances(name)]
            for row in apply_filter(ctx, rows, CATALOG_SERVICE_FIELDS):
                tags = names.setdefault(name, [])
                tags.extend(t for t in row["ServiceTags"] if t not in tags)
        return _readable_names(ctx, names)

    validate_filter(ctx, CATALOG_SERVICE_FIELDS)
    return await blocking(ctx, ("services",), lambda: index.of("services"), render)


def _readable_names(ctx: Context, names: dict[str, list[str]]) -> dict[str, list[str]]:
    # A map keyed by service name: the key, not the value, is what service:read is about.
    kept = {name: tags for name, tags in names.items() if ctx.authz.service_read(name)}
    ctx.filtered_by_acls = ctx.filtered_by_acls or len(kept) != len(names)
    return kept


@route("/v1/catalog/service/", ("GET",), acl="service:read", anonymous_empty=[])
async def catalog_service(ctx: Context):
    name = _name(ctx, "service name")
    catalog = ctx.cluster.catalog
    tags = ctx.req.query.get("tag", [])

    def render():
        rows = [svc.catalog_json(node) for node, svc, _ in catalog.instances(name)
                if not tags or _tag_match(svc.tags, tags)]
        return ctx.keep_readable(apply_filter(ctx, rows, CATALOG_SERVICE_FIELDS), acl.catalog_service_readable)

    validate_filter(ctx, CATALOG_SERVICE_FIELDS)
    return await blocking(ctx, catalog.service_topics(name), lambda: catalog.service_index(name), render,
                          cacheable=True)


@route("/v1/catalog/nodes", ("GET",), acl="node:read", anonymous_empty=[])
async def catalog_nodes(ctx: Context):
    catalog = ctx.cluster.catalog
    index = ctx.cluster.index

    def render():
        rows = [n.to_json() for _, n in sorted(catalog.nodes.items())]
        return ctx.keep_readable(apply_filter(ctx, rows, NODE_FIELDS), acl.node_readable)

    validate_filter(ctx, NODE_FIELDS)
    return await blocking(ctx, ("nodes",), lambda: index.of("nodes"), render)


@route("/v1/catalog/datacenters", ("GET",))
async def catalog_datacenters(ctx: Context):
    return json_response([ctx.cluster.datacenter])
