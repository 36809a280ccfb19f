"""Node-side tools: the node agent that registers a training node in Consul and
keeps its TTL check honest, drain/undrain (maintenance mode) and status.

* :mod:`.probes` -- pluggable local health probes and GPU detection.
* :mod:`.client` -- py-consul configured from ConsulConfig (explicit token wins).
* :mod:`.agent` -- the registration and TTL loop.
* :mod:`.cli`, :mod:`.drain`, :mod:`.status` -- the subcommands.
"""
