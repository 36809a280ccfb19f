"""Lost hosts: Consul's verdict that a host of a running world failed its health checks.

A host leaves a job in one of two ways, and the job must treat them oppositely:

* **drained** (Consul maintenance mode, ``hvd-elastic drain``): its workers are
  alive and finish the step; the job re-forms at the next commit with no
  rollback.  Nothing may interrupt a collective for it.
* **failed** (a check is ``critical``: the node agent's TTL ran out because the
  host froze or dropped off the network, ``serfHealth`` lost it, a probe
  failed): its workers may never answer again, and a collective waiting on them
  would wait out the whole Gloo timeout.  Such a host is *lost*.

:func:`host_states` tells them apart from the same health entries discovery
reads (every instance, not only passing ones): an instance in maintenance is
drained whatever its other checks say; one with a critical check and no
maintenance has failed.  An instance that is missing, only ``warning``, or
dropped for bad data or ``--exclude`` is not judged (no action): only a
positive health failure ends a collective.

:class:`LostHostJudge` adds the damping: a host counts as lost only once it
has been failed in EVERY answer for ``grace`` seconds (``HVD_ELASTIC_HEALTH_GRACE``,
default 1 s, on top of the TTL that already made it critical), so a check that
flaps critical for less than that never acts.  A host is judged only on a
failure that began after it was seen healthy in an answer since Consul last
failed to answer: a failed read forgets every pending verdict, and an agent
that comes back reports every check critical until the node agents' next
update, so neither an unreachable nor a freshly restarted Consul is ever
evidence against a host.
It is fed by :func:`hvd_elastic.health.watch.follow` (``answer``/``failure``)
and calls ``on_lost(host, why)`` once per failure of a host that ``watched()``
still lists -- again at every poll while it returns False ("not now").  Two
users: the discovery watcher on the launch host (:mod:`.reaper`) and every
host's first rank (:mod:`hvd_elastic.training._internal.health_cut`).
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable

from hvd_elastic.envvars import env_seconds
from hvd_elastic.health import hosts as hostlib

log = logging.getLogger(__name__)

GRACE_ENV = "HVD_ELASTIC_HEALTH_GRACE"
DEFAULT_GRACE_S = 1.0


class HostState(enum.Enum):
    HEALTHY = "healthy"
    DRAINED = "drained"
    FAILED = "failed"
    UNKNOWN = "unknown"  # absent, warning, excluded or bad data: never acted on


def host_states(decisions: Iterable[hostlib.Decision]) -> dict[str, tuple[HostState, str]]:
    """Each host's (state, reason) from every instance's decision; a host is as good as its best instance."""
    order = [HostState.HEALTHY, HostState.DRAINED, HostState.FAILED, HostState.UNKNOWN]
    best: dict[str, tuple[HostState, str]] = {}
    for d in decisions:
        if d.accepted:
            state = HostState.HEALTHY
        elif d.maintenance:
            state = HostState.DRAINED
        elif d.health == "critical":
            state = HostState.FAILED
        else:
            state = HostState.UNKNOWN
        held = best.get(d.host)
        if held is None or order.index(state) < order.index(held[0]):
            best[d.host] = (state, d.reason)
    return best


def grace_from_env(environ=os.environ) -> float:
    """``HVD_ELASTIC_HEALTH_GRACE`` in seconds (default 1); ConfigError naming a bad value."""
    return env_seconds(GRACE_ENV, DEFAULT_GRACE_S, environ)


class LostHostJudge:
    """Decides which watched hosts are lost (module docstring); thread-safe.

    Args:
        grace: seconds a host must stay failed before it is lost.
        watched: the hosts it may act on right now (called at every decision).
        on_lost: called with (host, Consul's reason) from the judge's thread; returning
            False means it did not act, and asks again at the next poll while the host stays lost.
    """

    def __init__(self, grace: float, watched: Callable[[], Iterable[str]], on_lost: Callable[[str, str], bool | None],
                 clock: Callable[[], float] = time.monotonic):
        self.grace = grace
        self._watched = watched
        self._on_lost = on_lost
        self._clock = clock
        self._cond = threading.Condition()
        self._failed_since: dict[str, tuple[float, str]] = {}  # host -> (first failed answer, reason)
        self._acted: set[str] = set()  # hosts reported lost during their current failure
        self._seen_healthy: set[str] = set()  # since Consul's last failure: only they can fail
        self._consul_down = False

    # -- fed by watch.follow ------------------------------------------------------

    def answer(self, decisions: list[hostlib.Decision], index: int, answered: float) -> None:
        now = self._clock()
        states = host_states(decisions)
        with self._cond:
            if self._consul_down:
                log.info("Consul answers again: judging hosts' health")
                self._consul_down = False
            self._seen_healthy.update(h for h, (state, _) in states.items() if state is HostState.HEALTHY)
            failed = {h: why for h, (state, why) in states.items()
                      if state is HostState.FAILED and h in self._seen_healthy}
            self._failed_since = {h: self._failed_since.get(h, (now, why)) for h, why in failed.items()}
            self._acted &= failed.keys()  # a host that recovered may be lost again later
            self._cond.notify_all()

    def failure(self, error: str) -> None:
        with self._cond:
            if not self._consul_down:
                log.warning("cannot read hosts' health from Consul (%s): no host is judged lost until it answers",
                            error)
                self._consul_down = True
            self._failed_since.clear()
            self._seen_healthy.clear()
            self._cond.notify_all()

    # -- deciding -------------------------------------------------------------------

    def due(self) -> list[tuple[str, str]]:
        """(host, reason) of every watched host failed for ``grace`` seconds and not yet acted on; marks them acted."""
        now = self._clock()
        with self._cond:
            if not any(h not in self._acted for h in self._failed_since):
                return []  # the common case: nothing failed, no need to ask who is watched
            watched = set(self._watched())
            lost = [(h, why) for h, (since, why) in self._failed_since.items()
                    if h in watched and h not in self._acted and now - since >= self.grace]
            self._acted.update(h for h, _ in lost)
        return lost

    def forget_acted(self) -> None:
        """Let hosts already acted on be acted on again (a new world was formed)."""
        with self._cond:
            self._acted.clear()

    def _next_due_in(self) -> float | None:
        now = self._clock()
        pending = [since + self.grace - now for h, (since, _) in self._failed_since.items() if h not in self._acted]
        return max(min(pending), 0.0) if pending else None

    def run(self, stop: threading.Event, poll: float = 0.5) -> None:
        """Call ``on_lost`` for every lost host until ``stop`` is set.

        Also wakes every ``poll`` seconds: ``watched()`` may have gained a host
        that has been failed for a while.
        """
        while not stop.is_set():
            for host, why in self.due():
                try:
                    acted = self._on_lost(host, why) is not False
                except Exception:  # a failed action must not end the judging of other hosts
                    log.exception("acting on lost host %s failed", host)
                    acted = True
                if not acted:
                    with self._cond:
                        self._acted.discard(host)
            with self._cond:
                wait = self._next_due_in()
                # Overdue yet pending (not watched, or on_lost declined): look again at the next poll, not at once.
                self._cond.wait(poll if wait is None or wait == 0.0 else min(wait, poll))
