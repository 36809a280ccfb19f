"""A Consul-compatible development agent: Consul's HTTP API, in memory, on loopback.

It stands in for ``consul agent -dev`` wherever no Consul binary is available
(laptops, CI, this project's tests), simulating a small cluster: one catalog
shared by several named nodes, each with its own agent HTTP port, as every GPU
node runs its own local Consul agent.  See :class:`DevCluster` and
``hvd-elastic consul-dev --help``.
"""

from .cluster import DevCluster

__all__ = ["DevCluster"]
