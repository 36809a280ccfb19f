"""What discovery asks Consul: the typed health query of a service, and the one call that reads it.

``hvd-elastic discover``, ``hvd-elastic status`` and the host-cache watcher
all read ``GET /v1/health/service/:name`` through :func:`read_health`, so the
three agree on tags, filter, staleness and ACL rules.  Imported only on paths
that query Consul (the warm cached call never does).
"""

from __future__ import annotations

import dataclasses
from urllib.parse import quote

from hvd_elastic.consul import client
from hvd_elastic.consul.config import ConfigError, ConsulConfig
from hvd_elastic.consul.errors import ConsulError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs time on this path
if TYPE_CHECKING:
    from typing import Any


_FLAGS = {"service": "--service", "tags": "--tag", "filter": "--filter"}


@dataclasses.dataclass(frozen=True)
class HealthQuery:
    """The service whose instances are hosts, and how to ask for them.

    ``stale`` lets any Consul server answer (``?stale``); such an answer is
    refused when its ``X-Consul-LastContact`` exceeds ``max_stale`` seconds.
    """

    service: str
    tags: tuple[str, ...] = ()
    filter: str | None = None
    stale: bool = False
    max_stale: float = 5.0
    # What set service, tags and filter (a flag or its variable), named when Consul refuses or finds nothing.
    settings: dict = dataclasses.field(default_factory=lambda: dict(_FLAGS), compare=False, repr=False)

    def setting(self, key: str) -> str:
        """The flag or variable that set ``key`` (service, tags or filter)."""
        return self.settings.get(key, _FLAGS[key])

    @property
    def path(self) -> str:
        """The health endpoint of the service, its name quoted as one path segment."""
        return f"/v1/health/service/{quote(self.service, safe='')}"

    def params(self, *, passing: bool) -> list[tuple[str, str]]:
        """Query parameters: ``passing`` drops instances with any non-passing check."""
        query = [("passing", "1")] if passing else []
        query += [("tag", tag) for tag in self.tags]
        if self.filter:
            query.append(("filter", self.filter))
        if self.stale:
            query.append(("stale", ""))
        return query


def read_health(
    config: ConsulConfig, query: HealthQuery, *, passing: bool, timeout: float,
    retry_window: float = 0.0, index: int = 0, wait: float = 0.0, retry: bool = True,
) -> tuple[Any, dict[str, str]]:
    """(raw health entries, answer headers); a blocking read when ``index`` > 0.  Raises ConsulError.

    With ``stale`` an answer whose ``X-Consul-LastContact`` exceeds
    ``max_stale`` (or that does not say) is a retryable failure.
    """
    params = query.params(passing=passing)
    if index > 0:
        params += [("index", str(index)), ("wait", f"{wait:g}s")]
    try:
        entries, headers = client.request(config, query.path, params, timeout=timeout, retry_window=retry_window,
                                          retry=retry)
    except ConsulError as exc:
        if query.filter and (exc.status == 400 or client.BAD_FILTER in str(exc)):  # bad input, not an outage
            raise ConfigError(f"{query.setting('filter')}={query.filter!r} is not a filter expression Consul "
                              f"accepts ({exc})") from None
        raise
    if query.stale:
        contact = headers.get("x-consul-lastcontact", "")
        if not contact.isdigit():
            raise ConsulError(f"Consul at {config.base_url} gave a ?stale answer without X-Consul-LastContact",
                              retryable=True)
        if int(contact) > query.max_stale * 1000:
            raise ConsulError(f"Consul at {config.base_url} answered from a server {int(contact) / 1000:g} s "
                              f"behind its leader (--max-stale {query.max_stale:g})", retryable=True)
    return client.check_not_hidden(config, entries, timeout), headers


def why_empty(config: ConsulConfig, query: HealthQuery, timeout: float) -> str | None:
    """Why ``query`` matched no instance at all, when its service or a tag exists nowhere; else None.

    One ``GET /v1/catalog/services`` (every service and the tags of its
    instances), asked only after an empty answer: a typo in ``--service`` or
    ``--tag`` otherwise looks like a cluster that has no node up yet.  None
    too when that listing fails or is hidden by ACLs: an empty answer is
    still a correct answer.
    """
    try:
        services = client.get_json(config, "/v1/catalog/services", timeout=timeout, retry=False)
    except (ConsulError, ConfigError):
        return None
    if not isinstance(services, dict):
        return None
    asked = f"{query.setting('service')}={query.service!r}"
    if query.service not in services:
        known = ", ".join(sorted(services)[:20]) + (", ..." if len(services) > 20 else "") or "none"
        return f"{asked} is not registered in Consul at {config.base_url} (services there: {known})"
    tags = services[query.service] or []
    missing = [tag for tag in query.tags if tag not in tags]
    if missing:
        carried = ", ".join(sorted(tags)) or "none"
        return (f"no instance of {asked} carries {query.setting('tags')} {', '.join(map(repr, missing))} "
                f"(its tags: {carried})")
    return None
