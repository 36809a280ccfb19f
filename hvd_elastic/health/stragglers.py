"""A straggler drain as Consul carries it: the job's request, and the maintenance reason of the drained node.

Policy ``drain`` (:mod:`hvd_elastic.training._internal.straggler_drain`)
splits the work between the two processes that can each do their half:

* the job's rank 0 knows which host is slow, but only a node's own Consul agent
  can put its service in maintenance (``/v1/agent/...`` acts on the agent it is
  sent to, and agents commonly listen on loopback only), so it writes a
  **request**: the KV key :func:`request_key` of the slow instance, its value
  the JSON of :class:`Request`;
* the slow node's agent (:mod:`hvd_elastic.nodeagent.readmit`) finds the key at
  its next tick, drains its own service with the **reason**
  :meth:`Drain.reason` and deletes the key; after the cool-down written in that
  reason it lifts the drain, whether the job is still there or not.

The reason is the only record a restarted node agent needs (when to lift), and
:func:`parse_reason` is how everyone tells such a drain from an operator's,
which is never lifted automatically.  Pure: no I/O.
"""

from __future__ import annotations

import calendar
import dataclasses
import json
import re
import time
from typing import Any

#: Where requests live, one key per service instance: ``KV_PREFIX/<service>/<node>/<service id>``.
KV_PREFIX = "hvd-elastic/straggler-drain"

_REASON = re.compile(r"hvd-elastic straggler drain #(?P<count>[1-9][0-9]*) until "
                     r"(?P<until>[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z): ")


def request_key(service: str, node: str, service_id: str) -> str:
    """The KV key asking ``node``'s agent to drain its instance ``service_id`` of ``service``."""
    return "/".join((KV_PREFIX, service, node, service_id))


@dataclasses.dataclass(frozen=True)
class Request:
    """What a job says about the host it wants drained: the figures the reason will name."""

    host: str
    ratio: float  # the host's own work per step over the job's median
    host_s: float
    job_median_s: float
    windows: int
    window: int

    def fields(self) -> dict[str, Any]:
        """The request as the JSON object the key holds."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, text: str | bytes) -> Request:
        """Raises ValueError when ``text`` is not a request's JSON (a key someone else wrote)."""
        try:
            fields: Any = json.loads(text)
            return cls(host=str(fields["host"]), ratio=float(fields["ratio"]), host_s=float(fields["host_s"]),
                       job_median_s=float(fields["job_median_s"]), windows=int(fields["windows"]),
                       window=int(fields["window"]))
        except (TypeError, KeyError, ValueError) as exc:  # JSONDecodeError is a ValueError
            raise ValueError(f"not a straggler-drain request: {exc}") from None

    def figures(self) -> str:
        """The sentence both the job's log and the reason use."""
        return (f"host {self.host} took {self.ratio:.2f}x the job's median own work per step "
                f"({self.host_s:.4f} s vs {self.job_median_s:.4f} s) in {self.windows} windows of "
                f"{self.window} commits")


@dataclasses.dataclass(frozen=True)
class Drain:
    """A straggler drain in force: its number on this node (the cool-down doubles with it) and its end."""

    count: int
    until: float  # Unix time, whole seconds

    def reason(self, request: Request) -> str:
        return f"hvd-elastic straggler drain #{self.count} until {_utc(self.until)}: {request.figures()}"

    def due(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) >= self.until


def parse_reason(text: str) -> Drain | None:
    """The :class:`Drain` a maintenance reason records; None for any other reason (an operator's)."""
    match = _REASON.match(text or "")
    if match is None:
        return None
    until = calendar.timegm(time.strptime(match["until"], "%Y-%m-%dT%H:%M:%SZ"))
    return Drain(int(match["count"]), until)


def cooldown(base: float, limit: float, count: int) -> float:
    """Seconds drain number ``count`` keeps a host out: ``base``, doubled for each drain before it, at most
    ``limit``."""
    return min(limit, base * 2 ** min(count - 1, 32))


def _utc(when: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(when)))

