"""Node-side tools: the node agent that registers a training node in Consul and
keeps its TTL check honest, and drain/undrain (maintenance mode).

They talk to Consul only through :mod:`hvd_elastic.consul` and parse flags with
:mod:`hvd_elastic.options`; nothing here imports discovery.

* :mod:`.probes` -- pluggable local health probes and GPU detection.
* :mod:`.loop` -- the registration and TTL loop.
* :mod:`.cli`, :mod:`.drain` -- the subcommands.
"""
