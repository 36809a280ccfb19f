"""``/v1/session/*``: create, renew, destroy, info, list and per-node listing."""

from __future__ import annotations

from ..errors import HTTPError
from .base import Context, blocking, json_response, route


@route("/v1/session/create", ("PUT",), acl="session:write")
async def session_create(ctx: Context):
    """Create a session; an unknown ``?dc=`` is Consul's 500 ``No path to datacenter``,
    an unknown ``Node`` its 500 ``Missing node registration``."""
    dc = ctx.req.arg("dc")
    if dc and dc != ctx.cluster.datacenter:
        raise HTTPError(500, "No path to datacenter")
    body = ctx.json_body() if ctx.req.body.strip() else None
    session = ctx.cluster.sessions.create(body, default_node=ctx.agent.node)
    return json_response({"ID": session.id})


@route("/v1/session/destroy/", ("PUT",), acl="session:write")
async def session_destroy(ctx: Context):
    return json_response(ctx.cluster.sessions.destroy(ctx.tail))


@route("/v1/session/renew/", ("PUT",), acl="session:write")
async def session_renew(ctx: Context):
    return json_response([ctx.cluster.sessions.renew(ctx.tail).to_json()])


def _listing(ctx: Context, select):
    sessions = ctx.cluster.sessions

    def render():
        return [s.to_json() for s in sessions.sessions.values() if select(s)]

    return blocking(ctx, ("sessions",), sessions.table_index, render)


@route("/v1/session/info/", ("GET",), acl="session:read", anonymous_empty=[])
async def session_info(ctx: Context):
    session_id = ctx.tail
    return await _listing(ctx, lambda s: s.id == session_id)


@route("/v1/session/node/", ("GET",), acl="session:read", anonymous_empty=[])
async def session_node(ctx: Context):
    node = ctx.tail
    return await _listing(ctx, lambda s: s.node == node)


@route("/v1/session/list", ("GET",), acl="session:read", anonymous_empty=[])
async def session_list(ctx: Context):
    return await _listing(ctx, lambda s: True)
