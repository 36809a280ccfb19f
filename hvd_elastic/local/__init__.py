"""Running hvd-elastic's processes on this machine: what ``hvd-elastic demo`` starts, watches and ends.

* :mod:`.env`  -- the environment a child process gets (the venv first on PATH,
  no inherited Consul token) and where the project's programs are.
* :mod:`.job`  -- :class:`~.job.Job`: a horovodrun, node agent or standby process
  tree in its own session with a log file; waiting on it, killing all of it.
* :mod:`.realconsul` -- HashiCorp Consul agents on loopback, or the embedded dev
  agent, behind one interface (:func:`~.realconsul.consul_cluster`).
* :mod:`.ports` -- ports for those agents that never collide.

The test suite's bed (network-namespace hosts, fault injection, test doubles)
builds on these; it lives in the checkout's ``testbed/`` and is not shipped.
Nothing here is imported by the training or discovery code paths.
"""
