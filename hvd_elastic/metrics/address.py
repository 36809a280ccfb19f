"""``[HOST]:PORT`` for an exporter: loopback unless a host is written out."""

from __future__ import annotations

import re

from hvd_elastic.errors import HvdElasticError

#: The one environment variable every exporter reads when no flag or setting names an address.
ENV = "HVD_ELASTIC_METRICS_ADDR"
DEFAULT_HOST = "127.0.0.1"
EXAMPLE = "127.0.0.1:9404"

# A DNS name or an IPv4 address (letters, digits, '-', '.'), or a bracketed IPv6 address.
_FORM = re.compile(r"^(?:(?P<host>[A-Za-z0-9.-]*)|\[(?P<v6>[0-9A-Fa-f:.%A-Za-z]+)\]):(?P<port>[0-9]{1,5})$")


class MetricsAddressError(HvdElasticError, ValueError):
    """A metrics address that is not ``[HOST]:PORT``; the message is one line naming it."""


def parse(text: str, source: str = ENV) -> tuple[str, int]:
    """``(host, port)`` from ``HOST:PORT``, ``[IPv6]:PORT``, ``:PORT`` or ``PORT`` (port 0: any free one).

    ``source`` names where the text came from in the error (a flag, the variable).
    """
    value = text.strip()
    if value.isdigit():
        value = ":" + value
    match = _FORM.match(value)
    port = int(match["port"]) if match else -1
    if not match or port > 65535 or (match["host"] or "").strip(".-") != (match["host"] or ""):
        raise MetricsAddressError(f"{source}={text!r} is not a metrics address: expected [HOST]:PORT with "
                                  f"PORT 0-65535, e.g. {EXAMPLE}")
    return match["v6"] or match["host"] or DEFAULT_HOST, port
