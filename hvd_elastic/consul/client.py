"""Consul HTTP calls with a total deadline: the one client every hvd-elastic command uses.

Discovery runs every second under horovodrun, so this path must start fast and
finish on time: it uses only the standard library (see :mod:`.transport`) and
bounds every socket operation by what is left of one overall deadline.  The
node agent's writes, drain, status and doctor go through the same two
functions, so TLS (CA, client certificate, ``CONSUL_TLS_SERVER_NAME``), the
token (``X-Consul-Token``, never logged) and the error vocabulary are the same
everywhere.

Errors are :class:`ConsulError` with a one-line message fit for stderr:
``retryable`` tells whether waiting could help (unreachable, timeouts, 5xx)
or not (403, other 4xx, malformed JSON) and ``status`` holds the HTTP status
when Consul answered.  Bad local settings (TLS files, a token with control
characters) are :class:`ConfigError`.
"""

from __future__ import annotations

import json
import time
from urllib.parse import urlencode

from hvd_elastic.consul import transport
from hvd_elastic.consul.config import ConfigError, ConsulConfig
from hvd_elastic.consul.errors import ConsulError, ConsulTimeout

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs time on this path
if TYPE_CHECKING:
    from typing import Any


def _request(config: ConsulConfig, method: str, target: str, deadline: float,
             body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    headers = {"Accept": "application/json", "User-Agent": "hvd-elastic"}
    if body:
        headers["Content-Type"] = "application/json"
    if config.token:
        headers["X-Consul-Token"] = config.token
    ssl_context = config.ssl_context()
    try:
        return transport.request(method, config.host, config.port, target, headers, deadline, ssl_context,
                                 config.tls_server_name, body)
    except transport.InvalidHeader:
        raise ConfigError("the Consul ACL token contains control characters "
                          "(a stray newline in CONSUL_HTTP_TOKEN?)") from None


#: How Consul refuses a ``?filter=`` it cannot parse: a 400 on most endpoints, a 500 on ``/v1/health/service``
#: (Consul 1.x), which is no outage: asking again gets the same answer.
BAD_FILTER = "Failed to create boolean expression evaluator"


def index_of(headers: dict[str, str]) -> int:
    """An answer's ``X-Consul-Index``, 0 when it has none (or not a number)."""
    raw = headers.get("x-consul-index", "")
    return int(raw) if raw.isdigit() else 0


def _error_text(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip().splitlines()
    return text[0][:200] if text else "(empty body)"


def get_json(config: ConsulConfig, path: str, query: list[tuple[str, str]] | None = None, **how) -> Any:
    """``path`` (already URL-quoted) answered, its JSON body decoded (None when empty).

    Keywords as :func:`request` (``method``, ``body``, ``timeout``, ``retry_window``, ``retry``).
    """
    return request(config, path, query, **how)[0]


def request(
    config: ConsulConfig,
    path: str,
    query: list[tuple[str, str]] | None = None,
    *,
    method: str = "GET",
    body: Any = None,
    timeout: float = 0.8,
    retry_window: float = 0.0,
    retry: bool = True,
) -> tuple[Any, dict[str, str]]:
    """(decoded JSON body or None when empty, headers with lower-case names such as ``x-consul-index``).

    ``body``, when given, is sent as JSON (writes such as a service
    registration).  Each attempt may use at most ``timeout`` seconds;
    retryable failures are retried with a short back-off until
    ``max(timeout, retry_window)`` seconds have passed since the call began,
    so only idempotent calls (every GET and every PUT Consul's agent API has)
    belong here.  ``retry=False`` makes exactly one attempt: a caller with its
    own back-off (the watcher, the node agent's loop) must hear of a failure
    at once.  Raises :class:`ConsulError` or :class:`ConfigError`.
    """
    params = list(query or [])
    if config.datacenter:
        params.append(("dc", config.datacenter))
    url = path + ("?" + urlencode(params) if params else "")
    payload = b"" if body is None else json.dumps(body).encode()
    if not retry:
        return _attempt(config, method, url, time.monotonic() + timeout, payload)
    start = time.monotonic()
    window_end = start + max(timeout, retry_window)
    backoff = 0.05
    last: ConsulError | None = None
    while True:
        deadline = min(time.monotonic() + timeout, window_end)
        try:
            return _attempt(config, method, url, deadline, payload)
        except ConsulError as exc:
            if isinstance(exc, ConsulTimeout) and last is not None:
                exc = last  # a retry cut short by the window says less than the failure that caused it
            last = exc
            if not exc.retryable:
                raise exc from None
            if time.monotonic() + backoff >= window_end:
                raise ConsulError(f"{exc} (gave up after {time.monotonic() - start:.1f} s)", retryable=True,
                                  status=exc.status) from None
        time.sleep(backoff)
        backoff = min(backoff * 2, 0.5)


def _attempt(config: ConsulConfig, method: str, url: str, deadline: float,
             payload: bytes) -> tuple[Any, dict[str, str]]:
    where = f"Consul at {config.base_url}"
    try:
        status, headers, body = _request(config, method, url, deadline, payload)
    except TimeoutError:
        raise ConsulTimeout(f"{where} did not answer {method} {url.split('?')[0]} in time", retryable=True) from None
    except transport.BadAnswer as exc:
        raise ConsulError(f"{where} gave a bad answer: {exc}", retryable=exc.truncated) from None
    except OSError as exc:
        if config.scheme == "https":
            import ssl  # already loaded by ssl_context()

            if isinstance(exc, ssl.SSLError):  # certificate and handshake problems do not heal by waiting
                raise ConsulError(f"TLS with {where} failed: {exc.reason or exc}{_plain_http_hint(config, exc)}",
                                  retryable=False) from None
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise ConsulError(f"cannot reach {where}: {reason}", retryable=True) from None
    if status == 403:
        raise ConsulError(
            f"{where} refused access (403 {_error_text(body)}): "
            "give a token with the rights needed in CONSUL_HTTP_TOKEN_FILE or --token-file",
            retryable=False,
            status=status,
        )
    if headers.get("x-consul-results-filtered-by-acls", "").lower() == "true":
        # Printing what is left would be a partial list.
        raise ConsulError(
            f"{where} hid some results from this token (X-Consul-Results-Filtered-By-ACLs): "
            "give it service:read and node:read",
            retryable=False,
            status=status,
        )
    if status >= 500:
        text = _error_text(body)
        raise ConsulError(f"{where} failed: {status} {text}", retryable=BAD_FILTER not in text, status=status)
    if status != 200:
        raise ConsulError(f"{where} rejected the request: {status} {_error_text(body)}", retryable=False, status=status,
                          index=index_of(headers))
    if not body.strip():
        return None, headers
    try:
        return json.loads(body), headers
    except ValueError:
        raise ConsulError(f"{where} returned a body that is not JSON: {_error_text(body)!r}", retryable=False,
                          status=status) from None


# OpenSSL's words for a TLS handshake answered in plain text (an http:// port), across its versions.
_PLAIN_TEXT_REASONS = ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST")


def _plain_http_hint(config: ConsulConfig, exc) -> str:
    """What to do when an https request met a plain-http port (empty for any other TLS failure)."""
    if str(exc.reason or "").upper() not in _PLAIN_TEXT_REASONS:
        return ""
    return (f": the agent at port {config.port} answers plain HTTP, not HTTPS: use http:// in "
            f"{config.setting('addr')} (and unset CONSUL_HTTP_SSL), or the agent's HTTPS port")


def anonymous_is_denied(config: ConsulConfig, timeout: float) -> bool:
    """True when Consul enforces ACLs against requests without a token.

    With ACLs on, Consul answers listings made without a token with the
    anonymous token's view, usually empty, and a 200.  ``/v1/agent/self`` needs
    ``agent:read``, which a default-deny anonymous token lacks: a 403 there
    tells an ACL-hidden empty list from a genuinely empty one.
    """
    try:
        status, _, _ = _request(config, "GET", "/v1/agent/self", time.monotonic() + timeout)
    except (OSError, transport.BadAnswer):
        return False
    return status == 403


def check_not_hidden(config: ConsulConfig, answer: Any, timeout: float) -> Any:
    """``answer`` unchanged, unless it is empty only because ACLs hide everything from no token."""
    if not answer and answer is not None and not config.token and anonymous_is_denied(config, timeout):
        raise ConsulError(
            f"Consul at {config.base_url} enforces ACLs and no token is set: "
            "set CONSUL_HTTP_TOKEN_FILE or --token-file to a file holding one",
            retryable=False,
        )
    return answer
