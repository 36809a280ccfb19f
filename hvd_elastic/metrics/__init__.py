"""Prometheus metrics: the job (rank 0 of ``@hvd_elastic.run``) and the node agents.

Each exporter serves the Prometheus text format at ``http://ADDR/metrics`` from a
daemon thread (``prometheus_client``), only when asked: a ``--metrics-addr`` flag,
``RunConfig(metrics_addr=...)``, ``HVD_ELASTIC_METRICS_ADDR`` (the job) or
``HVD_ELASTIC_NODE_METRICS_ADDR`` (the node agent).  An address
without a host binds loopback; ``0.0.0.0`` must be written out.

Contracts shared by every exporter:

* metrics are never a reason to stop the thing they describe: a bad address or
  a port in use is one logged line naming it, and training or the node agent
  goes on without metrics;
* a scrape never waits for the work it describes: collectors read plain
  numbers under a lock held for microseconds, never across a collective, a
  Consul call or a reset;
* names follow Prometheus conventions (``hvd_elastic_`` prefix, base units,
  ``_total`` counters, labels with a handful of values).

Modules: :mod:`.address` (parsing ``[HOST]:PORT``), :mod:`.exporter` (the HTTP
server), :mod:`.histogram` (plain buckets that travel between ranks),
:mod:`.job` and :mod:`.nodeagent` (each exporter's metrics; the discovery watcher's are
:mod:`hvd_elastic.discovery.watch_metrics`, since this package sits below discovery).
"""
