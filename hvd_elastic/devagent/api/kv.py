"""``/v1/kv/<key>``: GET (single, ``recurse``, ``keys``, ``raw``), PUT and DELETE."""

from __future__ import annotations

from ..errors import HTTPError
from ..httpserver import Response
from ..kv import MAX_VALUE_SIZE
from .base import Context, blocking, json_response, route


def _conflicting(ctx: Context, *flags: str) -> None:
    given = [f for f in flags if ctx.req.has(f)]
    if len(given) > 1:
        raise HTTPError(400, f"Conflicting flags: {ctx.req.raw_query}")


@route("/v1/kv/", ("GET", "PUT", "DELETE"), acl="key:{method}")
async def kv_endpoint(ctx: Context):
    if ctx.req.method == "GET":
        return await (_get_keys(ctx) if ctx.req.has("keys") else _get(ctx))
    if ctx.req.method == "PUT":
        return _put(ctx)
    return _delete(ctx)


async def _get(ctx: Context) -> Response:
    kv = ctx.cluster.kv
    key = ctx.tail
    recurse = ctx.req.has("recurse")
    if recurse:
        topics = ("kvs",)
        index_fn = lambda: kv.prefix_index(key)  # noqa: E731
        result_index_fn = None
        render = lambda: [e.to_json() for e in kv.list(key)]  # noqa: E731
    else:
        topics = (f"kv:{key}",)
        index_fn = lambda: kv.key_index(key)  # noqa: E731
        entry_or_table = lambda: kv.entries[key].modify_index if key in kv.entries else kv.table_index()  # noqa: E731
        result_index_fn = entry_or_table
        render = lambda: [kv.entries[key].to_json()] if key in kv.entries else []  # noqa: E731
    response = await blocking(ctx, topics, index_fn, render, result_index_fn=result_index_fn,
                              status_fn=lambda rows: 200 if rows else 404)
    if response.status == 200 and ctx.req.has("raw") and not recurse:
        entry = kv.entries.get(key)
        if entry is not None:
            headers = dict(response.headers)
            headers["Content-Type"] = "text/plain; charset=utf-8"
            headers["X-Content-Type-Options"] = "nosniff"
            return Response(200, entry.value, headers)
    if response.status == 404:
        response.headers.pop("Content-Type", None)
    return response


async def _get_keys(ctx: Context) -> Response:
    kv = ctx.cluster.kv
    prefix = ctx.tail
    separator = ctx.req.arg("separator")
    return await blocking(ctx, ("kvs",), lambda: kv.prefix_index(prefix), lambda: kv.keys(prefix, separator),
                          status_fn=lambda keys: 200 if keys else 404)


def _put(ctx: Context) -> Response:
    kv = ctx.cluster.kv
    key = ctx.tail
    if not key:
        raise HTTPError(400, "Missing key name")
    _conflicting(ctx, "cas", "acquire", "release")
    body = ctx.req.body
    if len(body) > MAX_VALUE_SIZE:
        raise HTTPError(
            413,
            f"Request body({len(body)} bytes) too large, max size: {MAX_VALUE_SIZE} bytes. See "
            "https://developer.hashicorp.com/docs/agent/config/config-files#kv_max_value_size.",
        )
    flags = ctx.uint_arg("flags") or 0
    if ctx.req.has("acquire"):
        ok = kv.acquire(key, body, flags, ctx.req.arg("acquire"))
    elif ctx.req.has("release"):
        ok = kv.release(key, body, flags, ctx.req.arg("release"))
    else:
        ok = kv.put(key, body, flags, cas=ctx.uint_arg("cas"))
    return json_response(ok)


def _delete(ctx: Context) -> Response:
    kv = ctx.cluster.kv
    key = ctx.tail
    _conflicting(ctx, "recurse", "cas")
    if ctx.req.has("recurse"):
        ok = kv.delete_tree(key)
    else:
        if not key:
            raise HTTPError(400, "Missing key name")
        ok = kv.delete(key, cas=ctx.uint_arg("cas"))
    return json_response(ok)

