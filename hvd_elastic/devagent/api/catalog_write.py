"""``PUT /v1/catalog/register`` and ``PUT /v1/catalog/deregister`` (see :mod:`..registration`).

Both answer ``true`` as Consul does.  They need ``node:write`` and
``service:write``: with ACLs on, only the management token may call them.
"""

from __future__ import annotations

from .. import registration
from ..errors import HTTPError
from .base import Context, json_response, route


def _datacenter(ctx: Context) -> None:
    dc = ctx.req.arg("dc")
    if dc and dc != ctx.cluster.datacenter:
        raise HTTPError(500, "No path to datacenter")


@route("/v1/catalog/register", ("PUT",), acl="node:write")
async def catalog_register(ctx: Context):
    _datacenter(ctx)
    registration.register(ctx.cluster.catalog, set(ctx.cluster.agents), ctx.json_body())
    return json_response(True)


@route("/v1/catalog/deregister", ("PUT",), acl="node:write")
async def catalog_deregister(ctx: Context):
    _datacenter(ctx)
    registration.deregister(ctx.cluster.catalog, set(ctx.cluster.agents), ctx.json_body())
    return json_response(True)
