"""ACL tokens and what each may read: the management token and one optional restricted token.

With ACLs on (``default_policy = deny``) the dev agent knows at most two
secrets: the management token, which may do everything, and a *restricted*
token, whose policy is only read rules::

    node_prefix "<p>"    { policy = "read" }   # for each given node prefix
    service_prefix "<p>" { policy = "read" }   # for each given service prefix

As in Consul, a read endpoint does not refuse such a token: it drops the rows
the token may not read and, only when it dropped something, answers
``X-Consul-Results-Filtered-By-ACLs: true``.  Everything else (writes, KV,
sessions, ``agent:read``, ``operator:*``) is 403 ``Permission denied`` for it.
An empty prefix (``""``) matches every name, as in Consul.
"""

from __future__ import annotations

import dataclasses
import hmac
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from .errors import HTTPError

FILTERED_HEADER = "X-Consul-Results-Filtered-By-ACLs"
# Route permissions a restricted token passes; its rows are filtered per node and service.
READ_PERMISSIONS = ("node:read", "service:read")


@dataclasses.dataclass(frozen=True)
class Authorizer:
    """What one token may do.  ``node_prefixes``/``service_prefixes`` of None mean "every name"."""

    accessor_id: str
    management: bool
    node_prefixes: tuple[str, ...] | None = None
    service_prefixes: tuple[str, ...] | None = None

    def node_read(self, node: str) -> bool:
        return self.management or _prefixed(node, self.node_prefixes)

    def service_read(self, service: str) -> bool:
        return self.management or _prefixed(service, self.service_prefixes)

    def route_allowed(self, permission: str) -> bool:
        """May this token call an endpoint that needs ``permission`` at all (rows aside)?"""
        return self.management or permission in READ_PERMISSIONS

    def denied(self, permission: str, resource: str = "") -> HTTPError:
        """Consul's 403 for a known token lacking ``permission`` (on ``resource``, when named)."""
        on = f' on "{resource}"' if resource else ""
        return HTTPError(403, f"Permission denied: token with AccessorID '{self.accessor_id}' "
                              f"lacks permission '{permission}'{on}")


def _prefixed(name: str, prefixes: tuple[str, ...] | None) -> bool:
    return prefixes is None or any(name.startswith(p) for p in prefixes)


MANAGEMENT = Authorizer(accessor_id="00000000-0000-0000-0000-000000000001", management=True)


class Tokens:
    """The secrets a dev cluster accepts, resolved to :class:`Authorizer` objects."""

    def __init__(self, management: str, restricted: str | None = None,
                 node_prefixes: Iterable[str] = (), service_prefixes: Iterable[str] = ()) -> None:
        if restricted is not None and restricted == management:
            raise ValueError("the restricted token must differ from the management token")
        self._entries: list[tuple[bytes, Authorizer]] = [(management.encode(), MANAGEMENT)]
        if restricted is not None:
            self._entries.append((restricted.encode(), Authorizer(
                accessor_id=str(uuid.uuid4()), management=False,
                node_prefixes=tuple(node_prefixes), service_prefixes=tuple(service_prefixes),
            )))

    def resolve(self, secret: str) -> Authorizer | None:
        """The token's authorizer, or None for a secret Consul would answer ``ACL not found``."""
        found = None
        for known, authz in self._entries:
            # Compare with every known secret, so timing says nothing about which one matched.
            if hmac.compare_digest(secret.encode(), known):
                found = authz
        return found


# -- what each kind of row needs (Consul's acl_filter) -------------------------


def health_row_readable(authz: Authorizer, row: dict) -> bool:
    """``/v1/health/service`` rows: node:read on the node and service:read on the service."""
    return authz.node_read(row["Node"]["Node"]) and authz.service_read(row["Service"]["Service"])


def catalog_service_readable(authz: Authorizer, row: dict) -> bool:
    return authz.node_read(row["Node"]) and authz.service_read(row["ServiceName"])


def check_readable(authz: Authorizer, row: dict) -> bool:
    """A node check needs node:read; a service check needs service:read as well."""
    if not authz.node_read(row["Node"]):
        return False
    return not row.get("ServiceID") or authz.service_read(row.get("ServiceName", ""))


def node_readable(authz: Authorizer, row: dict) -> bool:
    return authz.node_read(row["Node"])


def keep_readable(authz: Authorizer, rows: Any, readable: Callable[[Authorizer, Any], bool]) -> tuple[Any, bool]:
    """(rows the token may read, whether any was dropped) of a list, or of a map's values."""
    if authz.management:
        return rows, False
    if isinstance(rows, dict):
        kept_map = {k: v for k, v in rows.items() if readable(authz, v)}
        return kept_map, len(kept_map) != len(rows)
    kept = [row for row in rows if readable(authz, row)]
    return kept, len(kept) != len(rows)
