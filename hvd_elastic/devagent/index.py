"""The Raft-like index and the wake-ups that blocking queries wait on.

Every write to the dev agent's state takes the next value of one global,
monotonically increasing index (as every Raft log entry does in Consul) and
stamps it on the *topics* it touched: a table ("nodes", "services", "checks",
"kvs", "sessions") or one resource ("service:web").  A blocking query waits
on the topics its answer depends on and re-evaluates only when one of them
moves, so thousands of idle watchers cost one future and one timer each and no
thread.  As in Consul, a wake-up is no promise that the answer changed.

Everything here runs on the dev agent's event loop thread; nothing locks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable


class RaftIndex:
    """Global index plus per-topic modify indexes and their waiters."""

    def __init__(self) -> None:
        # Consul's first Raft write is internal (the cluster configuration), so
        # no user-visible answer ever carries index 0 or 1.
        self.current = 1
        self._topics: dict[str, int] = {}
        self._waiters: dict[str, set[asyncio.Future]] = {}

    def bump(self, *topics: str) -> int:
        """Take the next index for one write that touched ``topics``; wake their watchers."""
        self.current += 1
        for topic in topics:
            self._topics[topic] = self.current
        self._wake(topics)
        return self.current

    def touch(self, index: int, *topics: str) -> None:
        """Stamp more topics with an index already taken by the current write."""
        for topic in topics:
            self._topics[topic] = index
        self._wake(topics)

    def of(self, *topics: str) -> int:
        """The highest modify index among ``topics`` (0 when none was ever written)."""
        return max((self._topics.get(t, 0) for t in topics), default=0)

    def _wake(self, topics: Iterable[str]) -> None:
        for topic in topics:
            for future in self._waiters.pop(topic, ()):
                if not future.done():
                    future.set_result(None)

    async def wait_past(
        self,
        topics: tuple[str, ...],
        min_index: int,
        index_fn: Callable[[], int],
        timeout: float,
    ) -> None:
        """Return once ``index_fn() > min_index`` or after ``timeout`` seconds.

        ``index_fn`` is re-evaluated only when one of ``topics`` is written.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while index_fn() <= min_index:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            future = loop.create_future()
            for topic in topics:
                self._waiters.setdefault(topic, set()).add(future)
            timer = loop.call_later(remaining, _resolve, future)
            try:
                await future
            finally:
                timer.cancel()
                for topic in topics:
                    waiting = self._waiters.get(topic)
                    if waiting is not None:
                        waiting.discard(future)
                        if not waiting:
                            del self._waiters[topic]

    @property
    def watcher_count(self) -> int:
        return len({id(f) for futures in self._waiters.values() for f in futures})


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
