"""Following the service's health: one blocking query, read again and again by Consul's rules.

:func:`follow` is the loop; :func:`watch_fetch` is its read of the service's
health (every instance, decided by :mod:`.hosts`).  Two kinds of process run
it: discovery's watcher (:mod:`hvd_elastic.discovery.watch`), which keeps a
job's host cache fresh and ends the sessions of lost hosts, and the first rank
of every training host (:mod:`hvd_elastic.training._internal.health_cut`).

The loop follows Consul's rules for blocking queries:

* the first request, and the first after any failure, is a plain read
  (no ``?index=``): the agent may have restarted with a lower index, and a
  blocking read would then park until its wait ran out;
* every answer's ``X-Consul-Index`` is the next ``?index=`` (with
  ``?wait=``); an index that went backwards resets to 0 (a plain read next),
  and the index is kept >= 1;
* every answer and every failure goes to each listener as it comes; after a
  failure the loop backs off (0.1 s doubling to 5 s, jittered) and re-reads;
* at most one request every :data:`MIN_REQUEST_INTERVAL_S`, as Consul asks of
  its clients.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence

from hvd_elastic.health import hosts as hostlib

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: discovery's direct path imports this module
if TYPE_CHECKING:
    from hvd_elastic.consul.config import ConsulConfig
    from hvd_elastic.health.query import HealthQuery

BACKOFF_MIN_S, BACKOFF_MAX_S = 0.1, 5.0
MIN_REQUEST_INTERVAL_S = 0.05  # Consul asks clients to rate-limit: at most 20 reads a second


# (index to wait past, 0 for a plain read) -> (decisions, X-Consul-Index, monotonic answer time)
Fetch = Callable[[int], "tuple[list[hostlib.Decision], int, float]"]


def next_index(previous: int, answered: int) -> int:
    """The ``?index=`` after an answer carrying ``answered`` (Consul's client rules)."""
    if answered < previous:
        return 0  # went backwards (a restarted agent, a new leader): start over with a plain read
    return max(answered, 1)


def follow(fetch: Fetch, publisher, stop: threading.Event, failures: tuple[type[BaseException], ...],
           listeners: Sequence = ()) -> None:
    """The blocking-query loop (module docstring); returns once ``stop`` is set.

    Every answer and failure goes to ``publisher`` and then to each of
    ``listeners`` (objects with the same ``answer``/``failure`` methods).
    """
    targets = (publisher, *listeners)
    index, backoff, last_start = 0, BACKOFF_MIN_S, 0.0
    while not stop.is_set():
        pause = last_start + MIN_REQUEST_INTERVAL_S - time.monotonic()
        if pause > 0 and stop.wait(pause):
            return
        last_start = time.monotonic()
        try:
            decisions, answered_index, answered_at = fetch(index)
        except failures as exc:
            for target in targets:
                target.failure(exc)
            index = 0
            if stop.wait(backoff * random.uniform(0.5, 1.0)):
                return
            backoff = min(backoff * 2, BACKOFF_MAX_S)
            continue
        backoff = BACKOFF_MIN_S
        for target in targets:
            target.answer(decisions, answered_index, answered_at)
        index = next_index(index, answered_index)


WATCH_PLAIN_READ_TIMEOUT_S = 10.0  # the watcher holds no horovodrun lock: a large answer may take its time
WATCH_SLACK_S = 10.0  # beyond wait + jitter, for the server to render and send a large answer


def watch_fetch(config: ConsulConfig, query: HealthQuery, options: hostlib.Options, wait: float, plain_timeout: float):
    """The watcher's ``fetch(index)`` for :func:`follow`: (decisions, X-Consul-Index, monotonic answer time).

    A blocking read parks up to ``wait`` seconds, a plain one (index 0) may take
    ``plain_timeout``.
    """
    from hvd_elastic.consul.errors import ConsulError
    from hvd_elastic.health.query import read_health

    def fetch(index: int) -> tuple[list[hostlib.Decision], int, float]:
        timeout = wait * 17 / 16 + WATCH_SLACK_S if index else max(plain_timeout, WATCH_PLAIN_READ_TIMEOUT_S)
        # A watcher lives as long as its job: follow a token file rotated meanwhile.
        # Every instance, not only passing ones: the reaper must tell a failed host from a drained one
        # (lost.host_states); the cache still holds only the accepted ones.  Consul's index, and so how
        # often a blocking read returns, is the same either way.
        entries, headers = read_health(config.with_fresh_token(), query, passing=False, index=index, wait=wait,
                                       timeout=timeout, retry=False)
        answered = time.monotonic()
        raw_index = headers.get("x-consul-index", "")
        if not raw_index.isdigit():
            raise ConsulError(f"Consul at {config.base_url} answered without an X-Consul-Index: cannot block on it",
                              retryable=True)
        return hostlib.evaluate(entries, options), int(raw_index), answered

    return fetch
