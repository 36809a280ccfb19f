"""Rule 7 of :mod:`.rules`: a given-up world's workers still inside its rendezvous are ended.

Rule 5 answers a doomed world's Gloo store requests with 503, so a worker
still polling the store fails in about 1.5 s.  A worker already past the
store, connecting its Gloo pairs, asks the store nothing more: when the peer
it connects to is cut off (a partition drops its packets) it waits out the
connection timeout, minutes, and Horovod's round cannot end without it
(``registration.py`` waits for every worker of the world).  The 200-fault
soak lost 3 minutes to one such worker (``benchmarks/README.md``).

Such a worker holds nothing worth the wait: it never got through
``hvd.init()`` in this process, so the state it would train on is the
checkpoint's or a survivor's.  So :data:`GRACE_S` after a world is doomed,
each worker of it that is still running, has recorded nothing for the next
round (a survivor that asked for its place has) and never registered with the
driver (``hvd.elastic.run`` registers once per process, after its first
``hvd.init()``) is ended through an event of its own: Horovod's events are
per host, and a host's stays set while the host is held out.  Its host is
spared rule 1's cooldown, as rule 5 spares a worker it refused.

Not covered: a survivor (registered long ago) stuck connecting inside a
re-initialisation.  It enters ``hvd.init()`` only once every rank of the new
world has arrived (:mod:`hvd_elastic.training._internal.rendezvous`), which
narrows that window but does not close it; the driver cannot tell it from a
survivor training.

Contract: :class:`Workers` wraps the driver's ``create_worker_fn``; every
method is thread-safe.  :func:`end_stuck_later` returns at once; its check
runs once, :data:`GRACE_S` later, and does nothing if the world was replaced,
is no longer doomed or the driver finished.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("hvd_elastic.horovodrun")

# Seconds: a worker refused by rule 5 fails in about 1.5 s, and a survivor records its question for the next
# world within a poll (50 ms); one still unrecorded after this is stuck or not yet in the rendezvous at all.
GRACE_S = 5.0

ENDED_EXIT = 128 + 15  # what a worker this module ended exits with: SIGTERM's, as a shell reports it
Slot = tuple[str, int]  # (host name, local rank), as Horovod's driver keys its workers


@dataclasses.dataclass
class _Worker:
    end: threading.Event
    registered: bool = False


class Workers:
    """The driver's running workers by slot, each with an event of its own that ends it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[Slot, _Worker] = {}
        self._last_exit_registered: dict[Slot, bool] = {}  # whether a slot's last worker got through hvd.init()

    def wrap(self, create_worker_fn: Callable) -> Callable:
        """``create_worker_fn`` (gloo_run's: runs one worker to its end) with this slot's own event added."""

        def create_worker(slot_info, events):
            key = (slot_info.hostname, slot_info.local_rank)
            worker = _Worker(threading.Event())
            with self._lock:
                self._running[key] = worker
            try:
                exit_code, timestamp = create_worker_fn(slot_info, [*(events or ()), worker.end])
                # safe_shell_exec's middleman races its own ending thread for the shell's status: psutil's wait
                # may reap the shell first, and subprocess then reads the lost status as 0.  A worker ended here
                # never finished its training; a 0 would read as the job's end.
                if worker.end.is_set() and exit_code == 0:
                    exit_code = ENDED_EXIT
                return exit_code, timestamp
            finally:
                with self._lock:
                    self._last_exit_registered[key] = worker.registered
                    if self._running.get(key) is worker:
                        del self._running[key]
        return create_worker

    def registered(self, slot: Slot) -> None:
        """The worker in ``slot`` got through ``hvd.init()`` (it registered its notification server)."""
        with self._lock:
            worker = self._running.get(slot)
            if worker is not None:
                worker.registered = True

    def unregistered(self) -> list[Slot]:
        with self._lock:
            return sorted(key for key, worker in self._running.items() if not worker.registered)

    def any_registered(self) -> bool:
        """Whether a running worker got through ``hvd.init()`` (it trained, or trains)."""
        with self._lock:
            return any(worker.registered for worker in self._running.values())

    def exited_registered(self, slot: Slot) -> bool:
        """Whether the worker that last exited from ``slot`` had got through ``hvd.init()``."""
        with self._lock:
            return self._last_exit_registered.get(slot, False)

    def end(self, slot: Slot) -> None:
        """Have ``safe_shell_exec`` terminate the worker in ``slot`` (SIGTERM to its session, then SIGKILL)."""
        with self._lock:
            worker = self._running.get(slot)
        if worker is not None:
            worker.end.set()


def end_stuck_later(driver: Any, workers: Workers, doomed: Callable[[], bool], spared: set[str]) -> None:
    """In :data:`GRACE_S`, end the workers of ``driver``'s current world that are stuck in its rendezvous,
    if that world is still the current one and still ``doomed()``; their hosts go into ``spared``."""
    world = driver._rank_assignments  # replaced whole when the next world starts
    timer = threading.Timer(GRACE_S, _end_stuck, args=(driver, world, workers, doomed, spared))
    timer.name, timer.daemon = "hvd-elastic-given-up", True
    timer.start()


def _end_stuck(driver: Any, world: dict, workers: Workers, doomed: Callable[[], bool], spared: set[str]) -> None:
    if driver.finished() or driver._rank_assignments is not world or not doomed():
        return
    recorded = set(driver._worker_registry.get_recorded_slots())
    for host, slot in workers.unregistered():
        if (host, slot) in recorded or not driver.has_rank_assignment(host, slot):
            continue
        spared.add(host)
        log.warning("hvd-elastic: %s[%d] is still inside the given-up world's rendezvous %.0f s later: ending it "
                    "(%s is not held out for it)", host, slot, GRACE_S, host)
        workers.end((host, slot))
