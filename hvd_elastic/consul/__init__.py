"""The one Consul client layer of hvd-elastic: every command talks to Consul through it.

* :mod:`.config` -- :class:`ConsulConfig`, the single reading of the ``CONSUL_*``
  variables (and their flags), the token-file reader.
* :mod:`.errors` -- :class:`ConsulError`, the single error vocabulary.
* :mod:`.transport` -- one HTTP/1.1 request over a socket with a deadline (stdlib only).
* :mod:`.client` -- requests with retries, status handling and ACL checks.
* :mod:`.api` -- the calls we make (agent services and checks, maintenance, leader).

Kept import-light: discovery, which horovodrun runs every second, imports
this package, so nothing here imports more than the standard library, and
``ssl`` only for https.
"""
