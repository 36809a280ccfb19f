"""``/v1/status/*`` and the dev agent's own control endpoints under ``/_dev/``.

``/_dev/`` lies outside Consul's ``/v1`` namespace on purpose: it lets a test
or an operator kill and revive a simulated node's agent from another process
(``PUT /_dev/node/<name>/stop`` and ``.../start``, sent to any live node's
port; with ACLs on it needs the management token), and make ``?stale`` reads
report a lagging follower (``PUT /_dev/stale-lag?ms=N``: their
``X-Consul-LastContact`` becomes N; 0 restores the leader's own answer).
"""

from __future__ import annotations

from ..errors import HTTPError
from .base import Context, empty_response, json_response, route

SERVER_RPC_ADDR = "127.0.0.1:8300"


@route("/v1/status/leader", ("GET",))
async def status_leader(ctx: Context):
    return json_response(SERVER_RPC_ADDR)


@route("/v1/status/peers", ("GET",))
async def status_peers(ctx: Context):
    return json_response([SERVER_RPC_ADDR])


@route("/_dev/node/", ("PUT",), acl="operator:write")
async def dev_node_control(ctx: Context):
    name, _, action = ctx.tail.rpartition("/")
    if name not in ctx.cluster.agents:
        raise HTTPError(404, f"unknown node {name!r} (known: {', '.join(sorted(ctx.cluster.agents))})")
    if action == "stop":
        await ctx.cluster.stop_node(name)
    elif action == "start":
        await ctx.cluster.start_node(name)
    else:
        raise HTTPError(404, f"unknown action {action!r} (expected stop or start)")
    return empty_response()


@route("/_dev/nodes", ("GET",), acl="operator:read")
async def dev_nodes(ctx: Context):
    return json_response({name: {"Address": ctx.cluster.node_address(name), "Running": agent.running}
                          for name, agent in sorted(ctx.cluster.agents.items())})


@route("/_dev/stale-lag", ("PUT",), acl="operator:write")
async def dev_stale_lag(ctx: Context):
    lag = ctx.uint_arg("ms")
    if lag is None:
        raise HTTPError(400, "missing ?ms= (milliseconds a ?stale answer reports as X-Consul-LastContact)")
    ctx.cluster.stale_lag_ms = lag
    return empty_response()
