"""``/v1/agent/*``: the local agent's services, checks, TTL updates and maintenance."""

from __future__ import annotations

from ... import __version__
from .. import acl
from .. import checks as checks_mod
from ..bexpr import FilterError, compile_filter
from ..catalog import CRITICAL, PASSING, WARNING
from ..decode import CHECK_UPDATE_FIELDS, DecodeError, decode_check, decode_struct
from ..errors import HTTPError
from .base import Context, empty_response, json_response, route
from .status import SERVER_RPC_ADDR

CONSUL_VERSION = "1.17.0"  # the Consul release whose API the dev agent follows
SERVICE_FIELDS = {"ID", "Service", "Tags", "Meta", "Port", "Address", "Weights", "EnableTagOverride", "Kind",
                  "Datacenter"}
CHECK_FIELDS = {"Node", "CheckID", "Name", "Status", "Notes", "Output", "ServiceID", "ServiceName",
                "ServiceTags", "Type"}


def validate_filter(ctx: Context, fields: set[str]) -> None:
    """400 for a bad ``?filter=`` before anything else happens (a blocking query must not wait first)."""
    apply_filter(ctx, [], fields)


def apply_filter(ctx: Context, rows: dict | list, fields: set[str]):
    """Apply ``?filter=`` (go-bexpr) to a list of rows or the values of a map."""
    text = ctx.req.arg("filter")
    if not text:
        return rows
    try:
        predicate = compile_filter(text, fields)
    except FilterError as exc:
        raise HTTPError(400, str(exc)) from None
    if isinstance(rows, dict):
        return {k: v for k, v in rows.items() if predicate(v)}
    return [row for row in rows if predicate(row)]


@route("/v1/agent/self", ("GET",), acl="agent:read")
async def agent_self(ctx: Context):
    agent, cluster = ctx.agent, ctx.cluster
    node = cluster.catalog.nodes[agent.node]
    return json_response({
        "Config": {
            "Datacenter": cluster.datacenter,
            "PrimaryDatacenter": cluster.datacenter,
            "NodeName": agent.node,
            "NodeID": node.id,
            "Revision": "hvd-elastic",
            "Server": True,
            "Version": CONSUL_VERSION,
            "BuildDate": "2026-01-01T00:00:00Z",
        },
        "DebugConfig": {"DevMode": True, "ACLsEnabled": cluster.tokens is not None,
                        "HvdElasticVersion": __version__},
        "Coord": None,
        "Member": {"Name": agent.node, "Addr": node.address, "Port": 8301,
                   "Tags": {"dc": cluster.datacenter, "role": "consul"}, "Status": 1},
        "Stats": stats(ctx),
        "Meta": {"consul-network-segment": ""},
    })


def stats(ctx: Context) -> dict:
    """``Stats`` of ``/v1/agent/self``: every value a string, as Consul's agent prints them.

    The dev agent is a single-server cluster that leads itself: leader ``true``,
    no peers, Raft term 2 (a dev server's first election), and the Raft indexes
    are the dev agent's own index.
    """
    cluster, agent = ctx.cluster, ctx.agent
    local = agent.local_checks()
    index = str(cluster.index.current)
    return {
        "agent": {
            "check_monitors": "0",
            "check_ttls": str(sum(1 for c in local.values() if c.type == "ttl")),
            "checks": str(len(local)),
            "services": str(len(cluster.catalog.services[agent.node])),
        },
        "build": {"prerelease": "", "revision": "hvd-elastic", "version": CONSUL_VERSION, "version_metadata": ""},
        "consul": {
            "acl": "enabled" if cluster.tokens is not None else "disabled",
            "bootstrap": "false",
            "known_datacenters": "1",
            "leader": "true",
            "leader_addr": SERVER_RPC_ADDR,
            "server": "true",
        },
        "raft": {
            "applied_index": index,
            "commit_index": index,
            "fsm_pending": "0",
            "last_log_index": index,
            "last_log_term": "2",
            "last_snapshot_index": "0",
            "last_snapshot_term": "0",
            "num_peers": "0",
            "protocol_version": "3",
            "protocol_version_max": "3",
            "protocol_version_min": "0",
            "snapshot_version_max": "1",
            "snapshot_version_min": "0",
            "state": "Leader",
            "term": "2",
        },
    }


@route("/v1/agent/members", ("GET",), acl="node:read", anonymous_empty=[])
async def agent_members(ctx: Context):
    cluster = ctx.cluster
    members = []
    for name, agent in sorted(cluster.agents.items()):
        node = cluster.catalog.nodes[name]
        members.append({"Name": name, "Addr": node.address, "Port": 8301,
                        "Tags": {"dc": cluster.datacenter, "role": "consul"},
                        "Status": 1 if agent.running else 4})
    members = ctx.keep_readable(members, lambda authz, m: authz.node_read(m["Name"]))
    return json_response(members, headers=ctx.acl_headers())


@route("/v1/agent/services", ("GET",), acl="service:read", anonymous_empty={})
async def agent_services(ctx: Context):
    dc = ctx.cluster.datacenter
    validate_filter(ctx, SERVICE_FIELDS)
    services = {sid: s.agent_json(dc) for sid, s in sorted(ctx.cluster.catalog.services[ctx.agent.node].items())}
    services = ctx.keep_readable(apply_filter(ctx, services, SERVICE_FIELDS),
                                 lambda authz, svc: authz.service_read(svc["Service"]))
    return json_response(services, headers=ctx.acl_headers())


@route("/v1/agent/service/", ("GET",), acl="service:read")
async def agent_service(ctx: Context):
    svc = ctx.cluster.catalog.services[ctx.agent.node].get(ctx.tail)
    if svc is None:
        raise HTTPError(404, f"unknown service ID: {ctx.tail}")
    if not ctx.authz.service_read(svc.name):
        raise ctx.authz.denied("service:read", svc.name)
    return json_response(svc.agent_json(ctx.cluster.datacenter))


@route("/v1/agent/checks", ("GET",), acl="node:read", anonymous_empty={})
async def agent_checks(ctx: Context):
    """The checks this agent runs: its services' checks, its node checks and maintenance checks.

    Not ``serfHealth``: Consul's servers keep that one in the catalog from
    gossip; no agent registers it, so it shows in ``/v1/health/*`` only.
    """
    validate_filter(ctx, CHECK_FIELDS)
    checks = {cid: c.to_json() for cid, c in sorted(ctx.agent.local_checks().items())}
    checks = ctx.keep_readable(apply_filter(ctx, checks, CHECK_FIELDS), acl.check_readable)
    return json_response(checks, headers=ctx.acl_headers())


@route("/v1/agent/service/register", ("PUT",), acl="service:write")
async def register_service(ctx: Context):
    replace = ctx.req.has("replace-existing-checks") and ctx.req.arg("replace-existing-checks") in ("", "true")
    ctx.agent.register_service(ctx.json_body(), replace_existing_checks=replace)
    return empty_response()


@route("/v1/agent/service/deregister/", ("PUT",), acl="service:write")
async def deregister_service(ctx: Context):
    ctx.agent.deregister_service(ctx.tail)
    return empty_response()


@route("/v1/agent/check/register", ("PUT",), acl="node:write")
async def register_check(ctx: Context):
    try:
        defn = decode_check(ctx.json_body(), "CheckDefinition")
    except DecodeError as exc:
        raise HTTPError(400, f"Request decode failed: {exc}") from None
    if not defn.get("Name"):
        raise HTTPError(400, "Missing check name")
    if defn.get("Status") and defn["Status"] not in (PASSING, WARNING, CRITICAL):
        raise HTTPError(400, "Bad check status")
    try:
        checks_mod.validate(defn)
    except ValueError as exc:
        raise HTTPError(400, f"Invalid check: {exc}") from None
    ctx.agent.register_check(defn)
    return empty_response()


@route("/v1/agent/check/deregister/", ("PUT",), acl="node:write")
async def deregister_check(ctx: Context):
    ctx.agent.deregister_check(ctx.tail)
    return empty_response()


def _ttl_update(status: str):
    async def handler(ctx: Context):
        ctx.agent.update_ttl(ctx.tail, status, ctx.req.arg("note"))
        return empty_response()

    return handler


route("/v1/agent/check/pass/", ("PUT",), acl="node:write")(_ttl_update(PASSING))
route("/v1/agent/check/warn/", ("PUT",), acl="node:write")(_ttl_update(WARNING))
route("/v1/agent/check/fail/", ("PUT",), acl="node:write")(_ttl_update(CRITICAL))


@route("/v1/agent/check/update/", ("PUT",), acl="node:write")
async def check_update(ctx: Context):
    try:
        update = decode_struct(ctx.json_body(), "checkUpdate", CHECK_UPDATE_FIELDS)
    except DecodeError as exc:
        raise HTTPError(400, f"Request decode failed: {exc}") from None
    status = update.get("Status", "")
    if status not in (PASSING, WARNING, CRITICAL):
        raise HTTPError(400, f"Invalid check status: '{status}'")
    ctx.agent.update_ttl(ctx.tail, status, update.get("Output", ""))
    return empty_response()


def _enable_arg(ctx: Context) -> bool:
    if not ctx.req.has("enable"):
        raise HTTPError(400, "Missing value for enable")
    raw = ctx.req.arg("enable")
    try:
        return ctx.bool_arg("enable")
    except HTTPError:
        raise HTTPError(400, f'Invalid value for enable: "{raw}"') from None


@route("/v1/agent/service/maintenance/", ("PUT",), acl="service:write")
async def service_maintenance(ctx: Context):
    if not ctx.tail:
        raise HTTPError(400, "Missing service ID")
    ctx.agent.service_maintenance(ctx.tail, _enable_arg(ctx), ctx.req.arg("reason"))
    return empty_response()


@route("/v1/agent/maintenance", ("PUT",), acl="node:write")
async def node_maintenance(ctx: Context):
    ctx.agent.node_maintenance(_enable_arg(ctx), ctx.req.arg("reason"))
    return empty_response()
