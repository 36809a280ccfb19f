"""Consul-backed host discovery for ``horovodrun --host-discovery-script``.

Kept import-light on purpose: horovodrun runs discovery every second, so
nothing here may import torch, horovod or any third-party HTTP client.
It talks to Consul through :mod:`hvd_elastic.consul`, as every command does, and
reads and judges the service's health with :mod:`hvd_elastic.health` (the
rules, the query, the blocking loop, the lost-host verdict), which training
shares.

* :mod:`.jobdir` -- which horovodrun job a call belongs to, and its private directory.
* :mod:`.firstcall` -- tells a job's first call (may wait for Consul) from later ones.
* :mod:`.cache` -- the host cache file: format, integrity and freshness.
* :mod:`.cachekey` -- which cache file answers a command line (tokens masked), and the files next to it.
* :mod:`.fast` -- the warm path: answer from the job's cache before parsing flags.
* :mod:`.watch` -- the watcher: keeps a cache fresh from one blocking query (:mod:`hvd_elastic.health.watch`).
* :mod:`.watch_metrics` -- the watcher's Prometheus metrics.
* :mod:`.reaper` -- the launcher's side of a lost host: end horovodrun's worker sessions to it,
  once :mod:`.host_answers` finds it no longer answers; :mod:`hvd_elastic.procfs` reads the ``/proc`` facts it needs.
* :mod:`.token_guard` -- keeps the Consul ACL token off other users' screens (discovery and the doctor).

The imports between these modules form no cycle, not even through an import
inside a function (``tests/discovery/test_import_cycles.py`` walks them all):
the warm path never imports the full one, the command's top
(:mod:`hvd_elastic.entry`, ``discovery/consul_hosts``) hands a call the cache
cannot answer to the full command, :mod:`hvd_elastic.commands.discover`
(``hvd-elastic discover`` and ``discovery/consul_hosts``);
:mod:`hvd_elastic.commands.status` is ``hvd-elastic status``.
"""
