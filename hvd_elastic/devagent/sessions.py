"""Sessions: the lease behind KV locks and leader election.

As in Consul, a session is tied to a node and health checks (``serfHealth`` by
default) and optionally a TTL.  It is invalidated when destroyed, when one of
its checks turns critical or is deregistered (so a dead node's locks are
freed), when its node is deregistered, or when its TTL lapses: Consul expires a session only after twice its
TTL.  Invalidation releases (or, with ``Behavior=delete``, deletes) the keys
it holds and starts their lock-delay.  Sessions are written under the topic
``sessions``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

from hvd_elastic.gotypes import SECOND, format_duration, parse_duration

from .catalog import CRITICAL, SERF_CHECK_ID, Catalog, Check
from .decode import SESSION_FIELDS, decode_struct
from .errors import HTTPError
from .index import RaftIndex
from .kv import KVStore

TTL_MIN_NS = 10 * SECOND
TTL_MAX_NS = 24 * 3600 * SECOND
DEFAULT_LOCK_DELAY_NS = 15 * SECOND
TTL_MULTIPLIER = 2


@dataclasses.dataclass
class Session:
    id: str
    name: str
    node: str
    lock_delay_ns: int
    behavior: str
    ttl: str
    checks: list[str]
    create_index: int = 0
    modify_index: int = 0

    def to_json(self) -> dict:
        return {
            "ID": self.id,
            "Name": self.name,
            "Node": self.node,
            "LockDelay": self.lock_delay_ns,
            "Behavior": self.behavior,
            "TTL": self.ttl,
            "NodeChecks": list(self.checks),
            "ServiceChecks": None,
            "CreateIndex": self.create_index,
            "ModifyIndex": self.modify_index,
        }


def _lock_delay(raw: object) -> int:
    # Consul's FixupLockDelay: a number below 1000 means seconds, else nanoseconds.
    if isinstance(raw, str):
        return parse_duration(raw)
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return int(raw * SECOND) if raw < 1000 else int(raw)
    raise ValueError(f"json: cannot unmarshal {type(raw).__name__} into Go struct field Session.LockDelay")


class Sessions:
    """All sessions; every method runs on the event loop thread."""

    def __init__(self, index: RaftIndex, catalog: Catalog, kv: KVStore, ttl_min_ns: int = TTL_MIN_NS) -> None:
        self.index = index
        self.ttl_min_ns = ttl_min_ns
        self.catalog = catalog
        self.kv = kv
        self.sessions: dict[str, Session] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        kv.session_exists = self.sessions.__contains__
        catalog.on_check_lost.append(self._on_check_lost)
        catalog.on_node_removed.append(self._on_node_removed)

    def table_index(self) -> int:
        return self.index.of("sessions")

    def create(self, body: object, default_node: str) -> Session:
        if body is None:
            body = {}
        try:
            args = decode_struct(body, "Session", SESSION_FIELDS)
            lock_delay = _lock_delay(args["LockDelay"]) if "LockDelay" in args else DEFAULT_LOCK_DELAY_NS
        except ValueError as exc:
            raise HTTPError(400, f"Request decode failed: {exc}") from None
        if args.get("ServiceChecks"):
            raise HTTPError(400, "Request decode failed: ServiceChecks are not supported by the hvd-elastic dev agent")
        behavior = args.get("Behavior") or "release"
        if behavior not in ("release", "delete"):
            raise HTTPError(400, f"Invalid Behavior setting '{behavior}'")
        ttl = args.get("TTL", "")
        ttl_ns = 0
        if ttl:
            try:
                ttl_ns = parse_duration(ttl)
            except ValueError as exc:
                raise HTTPError(400, f"Session TTL decode failed: {exc}") from None
            if ttl_ns != 0 and not self.ttl_min_ns <= ttl_ns <= TTL_MAX_NS:
                raise HTTPError(
                    400,
                    f"Invalid Session TTL '{ttl_ns}', must be between "
                    f"[{format_duration(self.ttl_min_ns)}={format_duration(TTL_MAX_NS)}]",
                )
        node = args.get("Node") or default_node
        if node not in self.catalog.nodes:
            raise HTTPError(500, "Missing node registration")
        checks: list[str] = []
        for cid in list(args.get("Checks", [SERF_CHECK_ID])) + list(args.get("NodeChecks", [])):
            if cid not in checks:
                checks.append(cid)
        for cid in checks:
            check = self.catalog.checks[node].get(cid)
            if check is None:
                raise HTTPError(500, f"Missing check '{cid}' registration")
            if check.status == CRITICAL:
                raise HTTPError(500, f"Check '{cid}' is in critical state")
        session = Session(str(uuid.uuid4()), args.get("Name", ""), node, lock_delay, behavior, ttl, checks)
        session.create_index = session.modify_index = self.index.bump("sessions", f"session:{session.id}")
        self.sessions[session.id] = session
        if ttl_ns:
            self._arm(session, ttl_ns)
        return session

    def _arm(self, session: Session, ttl_ns: int) -> None:
        old = self._timers.pop(session.id, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        self._timers[session.id] = loop.call_later(
            TTL_MULTIPLIER * ttl_ns / SECOND, self.destroy, session.id
        )

    def renew(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise HTTPError(404, f"Session id '{session_id}' not found")
        if session.ttl:
            self._arm(session, parse_duration(session.ttl))
        return session

    def destroy(self, session_id: str) -> bool:
        session = self.sessions.pop(session_id, None)
        timer = self._timers.pop(session_id, None)
        if timer is not None:
            timer.cancel()
        if session is not None:
            self.kv.invalidate_session(session_id, session.behavior == "delete", session.lock_delay_ns / SECOND)
            self.index.bump("sessions", f"session:{session_id}")
        return True

    def _on_node_removed(self, node: str) -> None:
        for session_id in [s.id for s in self.sessions.values() if s.node == node]:
            self.destroy(session_id)

    def _on_check_lost(self, check: Check) -> None:
        doomed = [
            s.id for s in self.sessions.values() if s.node == check.node and check.check_id in s.checks
        ]
        for session_id in doomed:
            self.destroy(session_id)
