"""Turn Consul health entries into horovodrun's ``host:slots`` lines.

Pure logic, no I/O: :func:`evaluate` decides, entry by entry, whether an
instance of the training service may join the job and under which host name
and slot count; :func:`merge` folds the accepted instances into one line per
host.  ``hvd-elastic discover`` prints the merged lines and ``hvd-elastic
status`` shows every decision with its reason, so both always agree.

Contracts:

* A host name is printed only if :func:`hvd_elastic.hostnames.is_valid_host`
  accepts it (an RFC 1123 host name or a dotted IPv4 address): Horovod hands
  it to ``ssh``.  Anything else is rejected, never repaired.
* Slots come from a ``Meta`` value that must be a positive decimal integer in
  ASCII digits, at most ``max_slots_per_host`` (default 1024): a larger value
  (``"99999999999999999999"``) is invalid data, dropped with a warning like a
  malformed one, never printed or silently lowered.
* An instance is healthy only if every one of its checks (node checks such as
  ``serfHealth`` and maintenance checks included) is ``passing``.  The query
  already asks Consul for ``?passing``; checking again here keeps a proxy or an
  older server that ignores the parameter from leaking sick nodes.
* Merging rule: several healthy instances that map to the same host yield ONE
  line whose slot count is the LARGEST of theirs.  Summing would let a stale
  duplicate registration (a re-registered instance whose old copy has not yet
  expired) double the processes started on a node; to give a host N slots,
  register one instance with ``Meta.slots = N`` (the node agent does).
* Output is sorted by host name so two calls over the same data print the same
  bytes.
* Malformed data (not the documented shape) raises :class:`MalformedResponse`:
  the caller must print nothing rather than a partial list.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Iterable, Sequence

from hvd_elastic.errors import HvdElasticError
from hvd_elastic.hostnames import is_valid_host

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs time on this path
if TYPE_CHECKING:
    from typing import Any

_POSITIVE_INT = re.compile(r"[1-9][0-9]*\Z")
DEFAULT_MAX_SLOTS = 1024

PASSING = "passing"
MAINTENANCE_CHECK_PREFIXES = ("_node_maintenance", "_service_maintenance:")


class MalformedResponse(HvdElasticError, ValueError):
    """The health response does not have the shape Consul documents."""


class HostNaming(enum.Enum):
    """Which Consul field becomes the host name horovodrun sees."""

    NODE = "node"  # the Consul node name (stable, the default)
    SERVICE_ADDRESS = "service-address"  # Service.Address, else the node's address
    NODE_ADDRESS = "node-address"  # Node.Address


class Verdict(enum.Enum):
    ACCEPTED = "accepted"
    UNHEALTHY = "unhealthy"  # a check is not passing (normal: not warned about)
    EXCLUDED = "excluded"  # listed in --exclude (normal: not warned about)
    BAD_HOST = "bad-host"  # invalid host name (warned about)
    BAD_SLOTS = "bad-slots"  # missing or invalid slot count (warned about)


@dataclasses.dataclass(frozen=True)
class Decision:
    """What discovery decided for one service instance."""

    node: str
    service_id: str
    host: str
    slots: int | None
    verdict: Verdict
    reason: str  # human-readable; empty when accepted
    health: str  # worst check status: passing, warning, critical or maintenance
    maintenance: str  # maintenance reason, empty when not in maintenance

    @property
    def accepted(self) -> bool:
        return self.verdict is Verdict.ACCEPTED

    @property
    def warn(self) -> bool:
        """True when the instance is dropped because its data is invalid."""
        return self.verdict in (Verdict.BAD_HOST, Verdict.BAD_SLOTS)


@dataclasses.dataclass(frozen=True)
class Options:
    slots_key: str = "slots"
    default_slots: int | None = None  # used when the Meta key is absent
    max_slots_per_host: int = DEFAULT_MAX_SLOTS
    naming: HostNaming = HostNaming.NODE
    exclude: frozenset[str] = frozenset()  # lower-case host names
    tags: tuple[str, ...] = ()  # every one must be present


def parse_slots(value: Any) -> int | None:
    """A positive integer from a Meta string such as ``"8"``; None when invalid."""
    if isinstance(value, str) and _POSITIVE_INT.match(value):
        return int(value)
    return None


def maintenance_reason(check: dict[str, Any]) -> str:
    """The reason a maintenance check carries: its Notes (where Consul puts the reason), else its Output; ''."""
    return str(check.get("Notes") or check.get("Output") or "")


def check_health(checks: list[dict[str, Any]]) -> tuple[str, str, str]:
    """(worst status, maintenance reason, what the failing checks say) of an entry's checks."""
    rank = {PASSING: 0, "warning": 1, "critical": 2}
    worst, maintenance, problems = PASSING, "", []
    for check in checks:
        if not isinstance(check, dict):
            raise MalformedResponse("a check is not a JSON object")
        check_id = check.get("CheckID", "")
        status = check.get("Status")
        if not isinstance(check_id, str) or not isinstance(status, str):
            raise MalformedResponse("a check has no string CheckID/Status")
        if check_id.startswith(MAINTENANCE_CHECK_PREFIXES):
            maintenance = maintenance_reason(check) or "maintenance"
        elif status != PASSING:
            problems.append(f"{check_id} {status}: {str(check.get('Output') or '').strip()}".rstrip(": "))
        if rank.get(status, 3) > rank.get(worst, 3):
            worst = status
    if maintenance:
        worst = "maintenance"
    return worst, maintenance, "; ".join(problems)


def _field(obj: Any, key: str, kind: type, where: str) -> Any:
    value = obj.get(key) if isinstance(obj, dict) else None
    if value is None and kind in (dict, list):
        return kind()
    if not isinstance(value, kind):
        raise MalformedResponse(f"{where}.{key} is not a {kind.__name__}")
    return value


def _host_name(node: dict[str, Any], service: dict[str, Any], naming: HostNaming) -> str:
    if naming is HostNaming.NODE:
        return _field(node, "Node", str, "Node")
    node_address = _field(node, "Address", str, "Node")
    if naming is HostNaming.NODE_ADDRESS:
        return node_address
    return service.get("Address") or node_address


def _judge(host: str, tags: list, meta: dict, options: Options) -> tuple[Verdict, str, int | None]:
    """(verdict, reason, slots) for a healthy instance."""
    if options.tags and not all(tag in tags for tag in options.tags):
        # Consul filtered by tag already; a server that ignored ?tag= must not widen the job.
        return Verdict.EXCLUDED, "missing tag", None
    if not is_valid_host(host):
        return Verdict.BAD_HOST, f"host name {host!r} is not a valid RFC 1123 name or IPv4 address", None
    if options.exclude and host.lower() in options.exclude:
        return Verdict.EXCLUDED, "excluded", None
    raw = meta.get(options.slots_key)
    slots = options.default_slots if raw is None else parse_slots(raw)
    if slots is None:
        shown = "missing" if raw is None else repr(raw)
        return Verdict.BAD_SLOTS, f"Meta.{options.slots_key} is {shown}, expected a positive integer", None
    if slots > options.max_slots_per_host:
        return Verdict.BAD_SLOTS, (f"Meta.{options.slots_key} is {slots}, above the maximum of "
                                   f"{options.max_slots_per_host} (--max-slots-per-host)"), None
    return Verdict.ACCEPTED, "", slots


def _decide(entry: Any, options: Options) -> Decision:
    if not isinstance(entry, dict):
        raise MalformedResponse("an entry is not a JSON object")
    node = _field(entry, "Node", dict, "entry")
    service = _field(entry, "Service", dict, "entry")
    checks = _field(entry, "Checks", list, "entry")
    node_name = _field(node, "Node", str, "Node")
    service_id = str(service.get("ID") or service.get("Service") or "")
    meta = _field(service, "Meta", dict, "Service")
    tags = _field(service, "Tags", list, "Service")
    health, maintenance, problems = check_health(checks)
    host = _host_name(node, service, options.naming)
    if health != PASSING:
        why = "; ".join(filter(None, [maintenance and f"maintenance: {maintenance}", problems]))
        verdict, reason, slots = Verdict.UNHEALTHY, why or health, None
    else:
        verdict, reason, slots = _judge(host, tags, meta, options)
    return Decision(node_name, service_id, host, slots, verdict, reason, health, maintenance)


def evaluate(entries: Any, options: Options = Options()) -> list[Decision]:
    """Decide for each entry of ``GET /v1/health/service/:name``; raises MalformedResponse."""
    if not isinstance(entries, list):
        raise MalformedResponse("the response is not a JSON array")
    return [_decide(entry, options) for entry in entries]


def merge(decisions: Iterable[Decision]) -> list[tuple[str, int]]:
    """One (host, slots) per host from the accepted decisions, sorted; the largest slot count wins."""
    slots_by_host: dict[str, int] = {}
    for d in decisions:
        if d.accepted:
            slots_by_host[d.host] = max(d.slots or 0, slots_by_host.get(d.host, 0))  # accepted: slots set
    return sorted(slots_by_host.items())


def drop_warnings(decisions: Iterable[Decision]) -> list[str]:
    """One warning per instance dropped for invalid data (host name or slots), as discovery prints it."""
    return [f"discover: dropping instance {d.service_id!r} on node {d.node!r}: {d.reason}" for d in decisions if d.warn]


def format_hosts(hosts: Sequence[tuple[str, int]]) -> str:
    """horovodrun's host-discovery output: ``host:slots`` lines."""
    return "".join(f"{host}:{slots}\n" for host, slots in hosts)
