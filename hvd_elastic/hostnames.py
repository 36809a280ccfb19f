"""Which host names may be handed to ssh: one rule for discovery's output and every host a command takes.

Horovod passes a discovered host to ``ssh`` and splits discovery's lines on
``:``, and ``hvd-elastic doctor --hosts`` runs ssh to each host it is given:
a name is accepted only if it is an RFC 1123 host name or a dotted IPv4
address (a leading ``-``, spaces, ``:``, shell or ssh metacharacters, labels
over 63 characters are rejected, never repaired).  Stdlib only (``re``):
discovery imports it on its every-second path.
"""

from __future__ import annotations

import re

# RFC 1123 labels (ASCII letters, digits and inner hyphens, 1-63 characters) joined by dots.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\Z")
_IPV4_OCTET = re.compile(r"(?:0|[1-9][0-9]{0,2})\Z")
MAX_HOSTNAME_LENGTH = 253


def is_valid_ipv4(name: str) -> bool:
    """Dotted quad, each octet 0-255 without leading zeros (resolvers read those as octal)."""
    parts = name.split(".")
    return len(parts) == 4 and all(_IPV4_OCTET.match(p) and int(p) <= 255 for p in parts)


def is_valid_host(name: str) -> bool:
    """True for an RFC 1123 host name or an IPv4 address that is safe to hand to ssh."""
    if not isinstance(name, str) or len(name) > MAX_HOSTNAME_LENGTH or not _HOSTNAME.match(name):
        return False
    # An all-numeric last label is no DNS name (RFC 3696 2): it must be IPv4.
    return is_valid_ipv4(name) if name.rpartition(".")[2].isdigit() else True
