"""Request dispatch: route matching, methods, ACL tokens and error answers, as Consul's ``wrap``.

* unknown path: 404 with an empty body;
* wrong method: 405 ``method X not allowed`` with ``Allow: OPTIONS,<methods>``;
  ``OPTIONS`` answers 200 with the same ``Allow``;
* ACLs (when a management token is configured, ``default_policy = deny``):
  the token comes from ``X-Consul-Token``, ``Authorization: Bearer`` or
  ``?token=``; an unknown token is 403 ``ACL not found``; no token is
  Consul's anonymous token, which may do nothing: writes get 403
  ``Permission denied``, listings come back empty; a restricted token (see
  :mod:`..acl`) may call read endpoints, whose handlers drop the rows it may
  not read, and nothing else;
* a handler's :class:`HTTPError` becomes its status with the reason as text.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..errors import HTTPError
from ..httpserver import Request, Response, text_response
from . import agent, catalog_write, health, kv, session, status  # noqa: F401  (register their routes)
from .base import ROUTES, Context, Route, json_response, meta_headers

if TYPE_CHECKING:
    from ..local_agent import LocalAgent
    from ..cluster import ClusterState

log = logging.getLogger(__name__)


_PREFIXES = sorted((p for p in ROUTES if p.endswith("/")), key=len, reverse=True)


def match(path: str) -> Route | None:
    """Go ServeMux rules: exact patterns match exactly, ``/``-terminated ones by prefix; longest wins."""
    exact = ROUTES.get(path)
    if exact is not None:
        return exact
    for pattern in _PREFIXES:
        if path.startswith(pattern):
            return ROUTES[pattern]
    return None


def request_token(req: Request) -> str:
    token = req.arg("token")
    if token:
        return token
    token = req.headers.get("x-consul-token", "")
    if token:
        return token
    auth = req.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return ""


def _anonymous_denied(permission: str) -> HTTPError:
    return HTTPError(
        403,
        f"Permission denied: anonymous token lacks permission '{permission}'. "
        "The anonymous token is used implicitly when a request does not specify a token.",
    )


async def dispatch(cluster: "ClusterState", local: "LocalAgent", req: Request) -> Response:
    response = await _dispatch(cluster, local, req)
    # The path only: a token may travel in the query string and never reaches a log.
    log.debug("%s %s %s -> %d", local.node, req.method, req.path, response.status)
    return response


async def _dispatch(cluster: "ClusterState", local: "LocalAgent", req: Request) -> Response:
    found = match(req.path)
    if found is None:
        return Response(404, b"", {})
    allow = ",".join(("OPTIONS",) + found.methods)
    if req.method == "OPTIONS":
        return Response(200, b"", {"Allow": allow})
    if req.method not in found.methods:
        response = text_response(405, f"method {req.method} not allowed")
        response.headers["Allow"] = allow
        return response
    ctx = Context(req=req, cluster=cluster, agent=local, pattern=found.pattern)
    try:
        if found.acl is not None and cluster.tokens is not None:
            token = request_token(req)
            permission = found.acl.format(method="read" if req.method == "GET" else "write")
            if not token:
                if found.anonymous_empty is not None:
                    return json_response(found.anonymous_empty, headers=meta_headers(cluster.index.current))
                raise _anonymous_denied(permission)
            authz = cluster.tokens.resolve(token)
            if authz is None:
                raise HTTPError(403, "ACL not found")
            if not authz.route_allowed(permission):
                raise authz.denied(permission)
            ctx.authz = authz
        return await found.handler(ctx)
    except HTTPError as exc:
        response = text_response(exc.status, exc.reason)
        response.headers.update(exc.headers)
        return response
