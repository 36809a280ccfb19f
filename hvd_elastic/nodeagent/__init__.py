"""Node-side tools: the node agent that registers a training node in Consul and
keeps its TTL check honest, and drain/undrain (maintenance mode).

They talk to Consul only through :mod:`hvd_elastic.consul`; nothing here
imports discovery or reads a command line.

* :mod:`.probes` -- pluggable local health probes and GPU detection.
* :mod:`.loop` -- the registration and TTL loop.
* :mod:`.slurm` -- what the agent learns from its Slurm allocation, and the node's Slurm state probe.
* :mod:`.standby` -- the probe that announces a node only once its warm standby answers.
* :mod:`.drain` -- maintenance on and off.
* :mod:`.leave` -- waiting for the job to leave this node after a drain.

Their commands are ``hvd-elastic node-agent``, ``drain`` and ``undrain``
(:mod:`hvd_elastic.commands`).
"""
