"""The discovery watcher's metrics: its blocking query, the cache it keeps fresh, and who read it.

A listener of the watch loop (:func:`hvd_elastic.health.watch.follow`): every
Consul answer and failure updates it.  The age of the cache and the answers
discovery calls printed (from the cache, or after querying Consul directly
because the cache could not vouch for itself) are read at scrape time: the
calls are separate processes, each appending one byte per answer to
``PATH.answers-cache`` or ``PATH.answers-direct`` (:func:`hvd_elastic.discovery.cachekey.count_answer`).
"""

from __future__ import annotations

import os
import time

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from hvd_elastic.health import hosts as hostlib
from hvd_elastic.discovery.cachekey import ANSWER_SOURCES, answer_count_path
from hvd_elastic.metrics.nodeagent import ERROR_KINDS, consul_error_kind


class _Answers(Collector):
    def __init__(self, path: str) -> None:
        self.path = path

    def collect(self):
        family = CounterMetricFamily("hvd_elastic_discovery_calls", "Host lists discovery calls printed for this "
                                     "cache, by where the answer came from.", labels=["answer"])
        for source in ANSWER_SOURCES:
            try:
                count = os.stat(answer_count_path(self.path, source)).st_size
            except OSError:
                count = 0
            family.add_metric([source], count)
        yield family


class WatcherMetrics:
    """Series of one watcher (one cache file), in a registry of their own (:attr:`registry`)."""

    def __init__(self, path: str) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.answers = Counter("hvd_elastic_discovery_consul_answers", "Answers of Consul to the watcher's health "
                               "query (blocking or plain).", registry=r)
        errors = Counter("hvd_elastic_discovery_consul_errors", "Failed reads of the health query, by kind.", ["kind"],
                         registry=r)
        self.errors = {kind: errors.labels(kind=kind) for kind in ERROR_KINDS}
        self.hosts = Gauge("hvd_elastic_discovery_hosts", "Hosts in the cache's list.", registry=r)
        self.index = Gauge("hvd_elastic_discovery_consul_index", "X-Consul-Index of the last answer.", registry=r)
        self.valid = Gauge("hvd_elastic_discovery_cache_valid", "1 while the cache holds an answer readers may print "
                           "(0 after a failure: they query Consul directly).", registry=r)
        self._answered: float | None = None  # wall time of the last answer
        age = Gauge("hvd_elastic_discovery_cache_age_seconds", "Seconds since Consul last answered (the cache's "
                    "age; +Inf before the first answer).", registry=r)
        age.set_function(lambda: float("inf") if self._answered is None else time.time() - self._answered)
        r.register(_Answers(path))

    # The watch loop's listener interface.
    def answer(self, decisions, index: int, answered: float) -> None:
        self._answered = time.time()
        self.answers.inc()
        self.hosts.set(len(hostlib.merge(decisions)))
        self.index.set(index)
        self.valid.set(1)

    def failure(self, error: BaseException) -> None:
        self.errors[consul_error_kind(error)].inc()
        self.valid.set(0)
