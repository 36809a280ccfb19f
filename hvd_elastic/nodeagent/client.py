"""The Consul client for node-side commands: py-consul, configured from ConsulConfig.

py-consul (the maintained client) is used for every write to the local agent.
Two of its habits are corrected here: it lets ``CONSUL_HTTP_TOKEN`` override
an explicit ``token=`` (so a ``--token`` flag would lose), and its default
request timeout is 30 s.  :class:`~hvd_elastic.config.ConsulConfig` has already
resolved flag-over-environment precedence, so its token is applied last.
"""

from __future__ import annotations

import consul
import requests

from hvd_elastic.config import ConsulConfig

#: Exceptions a Consul call may raise; catch these, then explain with :func:`describe`.
ERRORS = (consul.ConsulException, requests.RequestException)


def connect(config: ConsulConfig, timeout: float = 5.0) -> consul.Consul:
    cert = (config.client_cert, config.client_key) if config.client_cert else None
    client = consul.Consul(
        host=config.host,
        port=config.port,
        token=config.token,
        scheme=config.scheme,
        dc=config.datacenter,
        verify=config.requests_verify(),
        cert=cert,
        connections_timeout=timeout,
    )
    client.token = config.token  # explicit precedence, see module docstring
    return client


def describe(exc: BaseException, config: ConsulConfig) -> str:
    """A one-line explanation of a failed Consul call (never includes the token)."""
    where = f"Consul agent at {config.base_url}"
    if isinstance(exc, consul.ACLPermissionDenied):
        return f"{where} refused access (403 {str(exc).strip()[:200]}): give a token with the rights needed in CONSUL_HTTP_TOKEN_FILE or --token-file"
    if isinstance(exc, requests.exceptions.SSLError):
        reason = "certificate verify failed" if "CERTIFICATE_VERIFY_FAILED" in str(exc) else "handshake failed"
        return f"TLS with {where} failed: {reason} (check CONSUL_CACERT / --ca-file)"
    if isinstance(exc, requests.ConnectionError):
        return f"cannot reach {where}"
    if isinstance(exc, requests.Timeout):
        return f"{where} did not answer in time"
    return f"{where} failed: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__}"
