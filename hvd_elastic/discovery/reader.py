"""A small, fast, read-only Consul HTTP client with a total deadline.

horovodrun runs the discovery script every second and never times it out, so
this path must start fast and finish on time.  It uses only the standard
library (no ``requests``, whose import alone costs more than a whole discovery
call; see :mod:`.wire` for the transport) and bounds every socket operation by
what is left of one overall deadline.  TLS, CA, client certificate and token come from
:class:`hvd_elastic.config.ConsulConfig`; the token travels in the
``X-Consul-Token`` header and is never logged.

Errors are :class:`ConsulError` with a one-line message fit for stderr.
``retryable`` tells whether waiting could help (unreachable, timeouts, 5xx)
or not (403, 4xx, malformed JSON).
"""

from __future__ import annotations

import json
import time
from urllib.parse import urlencode

from hvd_elastic.config import ConfigError, ConsulConfig
from hvd_elastic.discovery import wire
from hvd_elastic.discovery.errors import ConsulError, ConsulTimeout  # noqa: F401 (re-exported)

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs time on this path
if TYPE_CHECKING:
    from typing import Any


def _request(config: ConsulConfig, method: str, target: str, deadline: float) -> tuple[int, dict[str, str], bytes]:
    headers = {"Accept": "application/json", "User-Agent": "hvd-elastic"}
    if config.token:
        headers["X-Consul-Token"] = config.token
    try:
        ssl_context = config.ssl_context()
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise ConfigError(f"cannot load the TLS files (CONSUL_CACERT/--ca-file, CONSUL_CLIENT_CERT/KEY): {exc}") from None
    try:
        return wire.request(method, config.host, config.port, target, headers, deadline, ssl_context, config.tls_server_name)
    except wire.InvalidHeader:
        raise ConfigError("the Consul ACL token contains control characters (a stray newline in CONSUL_HTTP_TOKEN?)") from None


def _error_text(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip().splitlines()
    return text[0][:200] if text else "(empty body)"


def get_json(config: ConsulConfig, path: str, query: list[tuple[str, str]] | None = None, **how) -> Any:
    """GET ``path`` (already URL-quoted) and decode its JSON body (None when empty).

    Keywords as :func:`get_answer` (``timeout``, ``retry_window``, ``method``, ``retry``).
    """
    return get_answer(config, path, query, **how)[0]


def get_answer(
    config: ConsulConfig,
    path: str,
    query: list[tuple[str, str]] | None = None,
    *,
    timeout: float = 0.8,
    retry_window: float = 0.0,
    method: str = "GET",
    retry: bool = True,
) -> tuple[Any, dict[str, str]]:
    """(decoded JSON body or None when empty, headers with lower-case names such as ``x-consul-index``).

    Each attempt may use at most ``timeout`` seconds; retryable failures are
    retried with a short back-off until ``max(timeout, retry_window)`` seconds
    have passed since the call began.  ``retry=False`` makes exactly one
    attempt: a caller with its own back-off (the watcher) must hear of a
    failure at once.  ``method="PUT"`` sends an idempotent, body-less write
    such as maintenance mode.  Raises :class:`ConsulError`.
    """
    params = list(query or [])
    if config.datacenter:
        params.append(("dc", config.datacenter))
    url = path + ("?" + urlencode(params) if params else "")
    if not retry:
        return _attempt(config, method, url, time.monotonic() + timeout)
    start = time.monotonic()
    window_end = start + max(timeout, retry_window)
    backoff = 0.05
    last: ConsulError | None = None
    while True:
        deadline = min(time.monotonic() + timeout, window_end)
        try:
            return _attempt(config, method, url, deadline)
        except ConsulError as exc:
            if isinstance(exc, ConsulTimeout) and last is not None:
                exc = last  # a retry cut short by the window says less than the failure that caused it
            last = exc
            if not exc.retryable:
                raise exc from None
            if time.monotonic() + backoff >= window_end:
                raise ConsulError(f"{exc} (gave up after {time.monotonic() - start:.1f} s)", retryable=True, status=exc.status) from None
        time.sleep(backoff)
        backoff = min(backoff * 2, 0.5)


def _attempt(config: ConsulConfig, method: str, url: str, deadline: float) -> tuple[Any, dict[str, str]]:
    where = f"Consul at {config.base_url}"
    try:
        status, headers, body = _request(config, method, url, deadline)
    except TimeoutError:
        raise ConsulTimeout(f"{where} did not answer {method} {url.split('?')[0]} in time", retryable=True) from None
    except wire.BadAnswer as exc:
        raise ConsulError(f"{where} gave a bad answer: {exc}", retryable=exc.truncated) from None
    except OSError as exc:
        if config.scheme == "https":
            import ssl  # already loaded by ssl_context()

            if isinstance(exc, ssl.SSLError):  # certificate and handshake problems do not heal by waiting
                raise ConsulError(f"TLS with {where} failed: {exc.reason or exc}", retryable=False) from None
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise ConsulError(f"cannot reach {where}: {reason}", retryable=True) from None
    if status == 403:
        raise ConsulError(
            f"{where} refused access (403 {_error_text(body)}): give a token with the rights needed in CONSUL_HTTP_TOKEN_FILE or --token-file",
            retryable=False,
            status=status,
        )
    if headers.get("x-consul-results-filtered-by-acls", "").lower() == "true":
        # Printing what is left would be a partial list.
        raise ConsulError(
            f"{where} hid some results from this token (X-Consul-Results-Filtered-By-ACLs): give it service:read and node:read",
            retryable=False,
            status=status,
        )
    if status >= 500:
        raise ConsulError(f"{where} failed: {status} {_error_text(body)}", retryable=True, status=status)
    if status != 200:
        raise ConsulError(f"{where} rejected the request: {status} {_error_text(body)}", retryable=False, status=status)
    if not body.strip():
        return None, headers
    try:
        return json.loads(body), headers
    except ValueError:
        raise ConsulError(f"{where} returned a body that is not JSON: {_error_text(body)!r}", retryable=False, status=status) from None


def anonymous_is_denied(config: ConsulConfig, timeout: float) -> bool:
    """True when Consul enforces ACLs against requests without a token.

    With ACLs on, Consul answers listings made without a token with the
    anonymous token's view, usually empty, and a 200.  ``/v1/agent/self`` needs
    ``agent:read``, which a default-deny anonymous token lacks: a 403 there
    tells an ACL-hidden empty list from a genuinely empty one.
    """
    try:
        status, _, _ = _request(config, "GET", "/v1/agent/self", time.monotonic() + timeout)
    except (OSError, wire.BadAnswer):
        return False
    return status == 403


def check_not_hidden(config: ConsulConfig, answer: Any, timeout: float) -> Any:
    """``answer`` unchanged, unless it is empty only because ACLs hide everything from no token."""
    if not answer and answer is not None and not config.token and anonymous_is_denied(config, timeout):
        raise ConsulError(
            f"Consul at {config.base_url} enforces ACLs and no token is set: set CONSUL_HTTP_TOKEN_FILE or --token-file to a file holding one",
            retryable=False,
        )
    return answer
