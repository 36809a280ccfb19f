"""The Consul calls hvd-elastic makes, one function each, over :mod:`.client`.

Small and flat, in the manner of py-consul's endpoint modules: each function
names the endpoint it calls, takes the typed :class:`ConsulConfig` and plain
values, and raises :class:`ConsulError` (or :class:`ConfigError` for bad local
settings).  Discovery's hot read of ``/v1/health/service/:name`` is built by
discovery itself (its query flags), on the same client.

Paths and shapes follow Consul's HTTP API documentation (``/v1/agent/*``,
``/v1/kv/*``, ``/v1/status/leader``); the dev agent serves the same.
"""

from __future__ import annotations

import base64
import dataclasses
from urllib.parse import quote

from hvd_elastic.consul import client
from hvd_elastic.consul.errors import ConsulError
from hvd_elastic.consul.config import ConsulConfig

# A human, a node agent tick or a Slurm epilog waits on these, not horovodrun's one-second loop.
DEFAULT_TIMEOUT_S = 5.0

TTL_STATUSES = ("passing", "warning", "critical")


def _segment(value: str) -> str:
    """``value`` as one path segment (a service ID may hold '/' or '?')."""
    return quote(value, safe="")


def _object(config: ConsulConfig, path: str, answer) -> dict:
    """``answer`` of ``path``, which Consul documents as a JSON object; ConsulError when it is not."""
    if not isinstance(answer, dict):
        raise ConsulError(f"Consul at {config.base_url} answered {path} with something that is not an object",
                          retryable=False)
    return answer


def leader(config: ConsulConfig, timeout: float = DEFAULT_TIMEOUT_S) -> str:
    """``GET /v1/status/leader``: the Raft leader's address, "" while there is none."""
    answer = client.get_json(config, "/v1/status/leader", timeout=timeout, retry=False)
    return answer if isinstance(answer, str) else ""


def agent_services(config: ConsulConfig, timeout: float = DEFAULT_TIMEOUT_S) -> dict:
    """``GET /v1/agent/services``: {service ID: service} registered on this agent.

    An empty answer to a call without a token, from an agent that denies
    anonymous requests, is an error (ACLs hide everything), not "no services".
    """
    path = "/v1/agent/services"
    return _object(config, path,
                   client.check_not_hidden(config, client.get_json(config, path, timeout=timeout), timeout))


def agent_service(config: ConsulConfig, service_id: str, timeout: float = DEFAULT_TIMEOUT_S) -> dict | None:
    """``GET /v1/agent/service/:id``: the instance ``service_id`` on this agent, None when it has none.

    One attempt: the node agent's loop is the retry.
    """
    path = f"/v1/agent/service/{_segment(service_id)}"
    try:
        return _object(config, path, client.get_json(config, path, timeout=timeout, retry=False))
    except ConsulError as exc:
        if exc.status == 404:
            return None
        raise


def agent_checks(config: ConsulConfig, timeout: float = DEFAULT_TIMEOUT_S) -> dict:
    """``GET /v1/agent/checks``: {check ID: check} registered on this agent."""
    path = "/v1/agent/checks"
    return _object(config, path, client.get_json(config, path, timeout=timeout))


def register_service(config: ConsulConfig, definition: dict, timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """``PUT /v1/agent/service/register`` with ``definition`` (Consul's CamelCase keys).

    One attempt: the node agent's loop is the retry.
    """
    client.request(config, "/v1/agent/service/register", method="PUT", body=definition, timeout=timeout, retry=False)


def deregister_service(config: ConsulConfig, service_id: str, timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """``PUT /v1/agent/service/deregister/:id`` (an unknown ID is no error in Consul)."""
    client.request(config, f"/v1/agent/service/deregister/{_segment(service_id)}", method="PUT", timeout=timeout)


def update_ttl(config: ConsulConfig, check_id: str, status: str, output: str,
               timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """``PUT /v1/agent/check/update/:id``: set a TTL check's status and output, restarting its TTL.

    Consul answers 500 for a check it does not know as a TTL check, with a
    text that changed across versions; :func:`has_check` is how to tell.
    """
    if status not in TTL_STATUSES:
        raise ValueError(f"TTL status {status!r} is not one of {', '.join(TTL_STATUSES)}")
    client.request(config, f"/v1/agent/check/update/{_segment(check_id)}", method="PUT",
                   body={"Status": status, "Output": output}, timeout=timeout, retry=False)


def has_check(config: ConsulConfig, check_id: str, timeout: float = DEFAULT_TIMEOUT_S) -> bool:
    """Whether this agent has the check ``check_id`` registered (``GET /v1/agent/checks``)."""
    return check_id in agent_checks(config, timeout)


def maintenance_check_id(service_id: str) -> str:
    """The ID of the check Consul adds while ``service_id`` is in maintenance (its reason is the check's Notes)."""
    return f"_service_maintenance:{service_id}"


def set_maintenance(config: ConsulConfig, service_id: str, enable: bool, reason: str | None = None,
                    timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """``PUT /v1/agent/service/maintenance/:id``: maintenance mode on (with ``reason``) or off; idempotent."""
    query = [("enable", "true" if enable else "false")] + ([("reason", reason)] if reason else [])
    client.request(config, f"/v1/agent/service/maintenance/{_segment(service_id)}", query, method="PUT",
                   timeout=timeout)


def agent_node_name(config: ConsulConfig, timeout: float = DEFAULT_TIMEOUT_S) -> str:
    """``GET /v1/agent/self``: the Consul node name of this agent (``Config.NodeName``)."""
    answer = _object(config, "/v1/agent/self", client.get_json(config, "/v1/agent/self", timeout=timeout))
    name = (answer.get("Config") or {}).get("NodeName")
    if not isinstance(name, str) or not name:
        raise ConsulError(f"Consul at {config.base_url} answered /v1/agent/self without Config.NodeName",
                          retryable=False)
    return name


def kv_get(config: ConsulConfig, key: str, timeout: float = DEFAULT_TIMEOUT_S) -> bytes | None:
    """``GET /v1/kv/:key``: the key's value, None when there is no such key.  One attempt."""
    entry, _ = kv_entry(config, key, timeout=timeout)
    return None if entry is None else entry.value


@dataclasses.dataclass(frozen=True)
class KVEntry:
    """One key's value and the Raft index of its last write (``ModifyIndex``, the check-and-set token)."""

    value: bytes
    modify_index: int


def kv_entry(config: ConsulConfig, key: str, *, index: int = 0, wait: float = 0.0,
             timeout: float = DEFAULT_TIMEOUT_S, retry_window: float = 0.0) -> tuple[KVEntry | None, int]:
    """``GET /v1/kv/:key``: (the entry or None when there is no such key, ``X-Consul-Index``).

    With ``index`` > 0 the read blocks until the key's index passes it or ``wait`` seconds (Consul's blocking
    query; ``timeout``, one attempt's, must cover the wait).  The returned index is the one to block on next.
    One attempt, or retries of what may heal for ``retry_window`` seconds.
    """
    path = "/v1/kv/" + quote(key, safe="/")
    query = [("index", str(index)), ("wait", f"{max(wait, 0.001):.3f}s")] if index > 0 else None
    try:
        answer, headers = client.request(config, path, query, timeout=timeout, retry_window=retry_window,
                                         retry=retry_window > 0)
    except ConsulError as exc:
        if exc.status == 404:
            return None, exc.index
        raise
    first = answer[0] if isinstance(answer, list) and answer else None
    modify_index = first.get("ModifyIndex") if isinstance(first, dict) else None
    if not isinstance(first, dict) or not isinstance(modify_index, int) or isinstance(modify_index, bool) \
            or modify_index <= 0:
        raise ConsulError(f"Consul at {config.base_url} answered {path} with something that is not a KV entry",
                          retryable=False)
    value = b"" if first.get("Value") is None else base64.b64decode(first["Value"])
    return KVEntry(value, modify_index), client.index_of(headers) or modify_index


def kv_cas(config: ConsulConfig, key: str, value: dict, index: int, timeout: float = DEFAULT_TIMEOUT_S) -> bool:
    """``PUT /v1/kv/:key?cas=index``, the value as ``value``'s JSON: whether it was written.  One attempt.

    ``index`` 0 writes only a key that does not exist; otherwise the key's ``ModifyIndex`` must still be
    ``index``.  Consul's answer carries no new index: read the key again for it.
    """
    answer = client.get_json(config, "/v1/kv/" + quote(key, safe="/"), [("cas", str(index))], method="PUT",
                             body=value, timeout=timeout, retry=False)
    if not isinstance(answer, bool):
        raise ConsulError(f"Consul at {config.base_url} answered a check-and-set of {key} with {answer!r}",
                          retryable=False)
    return answer


def kv_put(config: ConsulConfig, key: str, value: dict, timeout: float = DEFAULT_TIMEOUT_S,
           retry_window: float = 0.0) -> None:
    """``PUT /v1/kv/:key``, the value stored as ``value``'s JSON; idempotent, so retried for ``timeout`` seconds
    or ``retry_window`` when longer."""
    client.request(config, "/v1/kv/" + quote(key, safe="/"), method="PUT", body=value, timeout=timeout,
                   retry_window=retry_window)


def kv_delete(config: ConsulConfig, key: str, timeout: float = DEFAULT_TIMEOUT_S, *, recurse: bool = False) -> None:
    """``DELETE /v1/kv/:key``, with ``recurse`` every key that starts with ``key`` (a missing key is no error in
    Consul)."""
    client.request(config, "/v1/kv/" + quote(key, safe="/"), [("recurse", "")] if recurse else None,
                   method="DELETE", timeout=timeout)


def kv_keys(config: ConsulConfig, prefix: str, separator: str = "", timeout: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """``GET /v1/kv/:prefix?keys``: the keys under ``prefix``, each cut after the first ``separator`` past the
    prefix (Consul's folders); [] when there is none."""
    query = [("keys", "")] + ([("separator", separator)] if separator else [])
    try:
        answer = client.get_json(config, "/v1/kv/" + quote(prefix, safe="/"), query, timeout=timeout)
    except ConsulError as exc:
        if exc.status == 404:
            return []
        raise
    if not isinstance(answer, list) or not all(isinstance(key, str) for key in answer):
        raise ConsulError(f"Consul at {config.base_url} answered a key listing of {prefix} with {answer!r}",
                          retryable=False)
    return answer
