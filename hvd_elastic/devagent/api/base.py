"""Route registry, request context and the blocking-query machinery shared by all endpoints.

Endpoint modules register handlers with :func:`route`; :mod:`.dispatch`
matches paths the way Go's ``http.ServeMux`` does in Consul (a pattern ending
in ``/`` matches every path below it, the longest pattern wins).
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from hvd_elastic.envvars import ConfigError, parse_bool
from hvd_elastic.gotypes import SECOND, parse_duration, parse_uint64

from ..acl import FILTERED_HEADER, MANAGEMENT, Authorizer, keep_readable
from ..errors import HTTPError
from ..httpserver import Request, Response

if TYPE_CHECKING:
    from ..local_agent import LocalAgent
    from ..cluster import ClusterState

DEFAULT_WAIT_S = 300.0
MAX_WAIT_S = 600.0
JITTER_FRACTION = 16


@dataclasses.dataclass
class Context:
    """One request as a handler sees it."""

    req: Request
    cluster: "ClusterState"
    agent: "LocalAgent"
    pattern: str
    anonymous: bool = False  # ACLs on and no token: Consul's anonymous token
    authz: Authorizer = MANAGEMENT  # the request's token (management too when ACLs are off)
    # Set by a render that dropped rows this token may not read (see acl.keep_readable).
    filtered_by_acls: bool = False

    def acl_headers(self) -> dict[str, str]:
        """``X-Consul-Results-Filtered-By-ACLs: true`` when rows were dropped, as Consul sends it."""
        return {FILTERED_HEADER: "true"} if self.filtered_by_acls else {}

    def keep_readable(self, rows, readable):
        """Drop the rows this token may not read (after ``?filter=``, as Consul does), noting the drop."""
        kept, dropped = keep_readable(self.authz, rows, readable)
        self.filtered_by_acls = self.filtered_by_acls or dropped
        return kept

    @property
    def tail(self) -> str:
        """The part of the path below a prefix pattern (``/v1/kv/<tail>``)."""
        return self.req.path[len(self.pattern):]

    def bool_arg(self, name: str) -> bool:
        """A boolean query parameter parsed like Go's ``strconv.ParseBool``; 400 otherwise."""
        raw = self.req.arg(name)
        try:
            return parse_bool(name, raw)
        except ConfigError:
            raise HTTPError(400, f"Invalid value for {name}: {raw!r}") from None

    def uint_arg(self, name: str) -> int | None:
        if not self.req.has(name):
            return None
        raw = self.req.arg(name)
        try:
            return parse_uint64(raw)
        except ValueError:
            raise HTTPError(400, f"Invalid value for {name}: {raw!r} (expected an unsigned integer)") from None

    def json_body(self) -> Any:
        """The decoded JSON body; 400 ``Request decode failed`` when it is not JSON."""
        if not self.req.body.strip():
            raise HTTPError(400, "Request decode failed: EOF")
        try:
            return json.loads(self.req.body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise HTTPError(400, f"Request decode failed: {exc}") from None


EndpointFn = Callable[[Context], Awaitable[Response]]


@dataclasses.dataclass(frozen=True)
class Route:
    pattern: str
    methods: tuple[str, ...]
    handler: EndpointFn
    # ACL permission ("service:write"), or None when Consul checks no token.
    acl: str | None = None
    # With ACLs on and no token, answer this empty value instead of denying
    # (Consul filters what the anonymous token may not read).
    anonymous_empty: Any = dataclasses.field(default=None)


ROUTES: dict[str, Route] = {}


def route(pattern: str, methods: tuple[str, ...], acl: str | None = None, anonymous_empty: Any = None):
    """Register an endpoint handler for ``pattern``."""

    def register(fn: EndpointFn) -> EndpointFn:
        if pattern in ROUTES:
            raise ValueError(f"route {pattern} registered twice")
        ROUTES[pattern] = Route(pattern, methods, fn, acl, anonymous_empty)
        return fn

    return register


def json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    out = {"Content-Type": "application/json"}
    out.update(headers or {})
    return Response(status, json_bytes(obj), out)


def empty_response() -> Response:
    """What Consul answers when a write handler returns no object: 200, empty body."""
    return Response(200, b"", {})


def meta_headers(index: int, ctx: Context | None = None) -> dict[str, str]:
    """Consul's query-meta headers.  The dev agent is its own leader, so LastContact is 0,
    except for ``?stale`` reads while a test simulates a lagging follower (``/_dev/stale-lag``)."""
    consistency, last_contact = "leader", 0
    if ctx is not None and ctx.req.has("stale"):
        consistency, last_contact = "stale", ctx.cluster.stale_lag_ms
    elif ctx is not None and ctx.req.has("consistent"):
        consistency = "consistent"
    # Consul never returns index 0: a client passing ?index=0 would never block.
    return {
        "X-Consul-Index": str(max(index, 1)),
        "X-Consul-KnownLeader": "true",
        "X-Consul-LastContact": str(last_contact),
        "X-Consul-Effective-Consistency": consistency,
    }


def parse_query_options(ctx: Context) -> tuple[int, float]:
    """Validate ``dc``/consistency and return (min_index, wait seconds incl. jitter)."""
    req = ctx.req
    dc = req.arg("dc")
    if dc and dc != ctx.cluster.datacenter:
        raise HTTPError(500, "No path to datacenter")
    if req.has("stale") and req.has("consistent"):
        raise HTTPError(400, "Cannot specify ?stale with ?consistent, conflicting semantics.")
    wait = DEFAULT_WAIT_S
    if req.arg("wait"):
        try:
            wait = parse_duration(req.arg("wait")) / SECOND
        except ValueError:
            raise HTTPError(400, "Invalid wait time") from None
    min_index = 0
    if req.arg("index"):
        try:
            min_index = parse_uint64(req.arg("index"))
        except ValueError:
            raise HTTPError(400, "Invalid index") from None
    if wait <= 0:
        wait = DEFAULT_WAIT_S
    wait = min(wait, MAX_WAIT_S)
    return min_index, wait + random.uniform(0, wait / JITTER_FRACTION)


class ResponseCache:
    """Rendered bodies keyed by (request, index): many watchers woken by one write render once."""

    def __init__(self, size: int = 512) -> None:
        self.size = size
        self._items: OrderedDict[tuple, tuple[int, bytes]] = OrderedDict()

    def get(self, key: tuple, index: int) -> bytes | None:
        hit = self._items.get(key)
        if hit is None or hit[0] != index:
            return None
        self._items.move_to_end(key)
        return hit[1]

    def put(self, key: tuple, index: int, body: bytes) -> None:
        self._items[key] = (index, body)
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)


async def blocking(
    ctx: Context,
    topics: tuple[str, ...],
    index_fn: Callable[[], int],
    render_fn: Callable[[], Any],
    result_index_fn: Callable[[], int] | None = None,
    cacheable: bool = False,
    status_fn: Callable[[Any], int] | None = None,
) -> Response:
    """Answer a read endpoint with Consul's blocking-query semantics.

    With ``?index=N`` the answer waits until ``index_fn() > N`` or the wait
    (default 5 min, max 10 min, plus up to wait/16 jitter) runs out.
    ``render_fn`` returns the object to encode, or already encoded JSON bytes.
    ``result_index_fn`` gives the X-Consul-Index to report when it differs
    from what is waited on (a missing KV key reports the table's index).
    """
    min_index, wait = parse_query_options(ctx)
    if min_index > 0:
        await ctx.cluster.index.wait_past(topics, min_index, index_fn, wait)
    index = (result_index_fn or index_fn)()
    headers = {"Content-Type": "application/json", **meta_headers(index, ctx)}
    if cacheable and ctx.authz.management:  # a restricted token's answer is its own, and carries a header
        query = tuple(sorted((k, tuple(v)) for k, v in ctx.req.query.items() if k not in ("index", "wait", "token")))
        key = (ctx.req.path, query, ctx.anonymous)
        body = ctx.cluster.response_cache.get(key, index)
        if body is None:
            rendered = render_fn()
            body = rendered if isinstance(rendered, bytes) else json_bytes(rendered)
            ctx.cluster.response_cache.put(key, index, body)
        return Response(200, body, headers)
    result = render_fn()
    headers.update(ctx.acl_headers())
    status = status_fn(result) if status_fn else 200
    if status != 200:
        return Response(status, b"", headers)
    return Response(status, result if isinstance(result, bytes) else json_bytes(result), headers)
