"""A Consul-compatible development agent: Consul's HTTP API, in memory, on loopback.

It stands in for ``consul agent -dev`` wherever no Consul binary is available
(laptops, CI, this project's tests), simulating a small cluster: one catalog
shared by several named nodes, each with its own agent HTTP port, as every GPU
node runs its own local Consul agent.  See :class:`DevCluster` and
``hvd-elastic consul-dev --help``.

Served: ``/v1/agent/{self,members,services,service/:id,checks}``, service and
check (de)registration, TTL ``pass/warn/fail/update``, service and node
maintenance; ``/v1/health/{service,checks,node,state}``;
``/v1/catalog/{services,service,nodes,datacenters}``, ``/v1/catalog/{register,deregister}``
(external nodes: no agent, no ``serfHealth``); ``/v1/kv``;
``/v1/session/{create,renew,destroy,info,node,list}``; ``/v1/status/{leader,peers}``.
Every other path answers 404 like an unknown Consul endpoint.  Listings take
``?filter=``; with ACLs on, a second, restricted token (read rules by node and
service name prefix, see :mod:`.acl`) gets listings without what it may not
read and ``X-Consul-Results-Filtered-By-ACLs: true``, as in Consul.

Known, deliberate differences from Consul (each fails louder, never quieter):

* a JSON body key that names no field is rejected (``json: unknown field``);
  Consul drops it silently;
* unsupported features (script/gRPC/alias checks, Connect, namespaces,
  check thresholds) are refused with a 400 that says so;
* malformed ``flags``/``cas`` parameters and invalid session settings are 400
  where Consul answers 500;
* with ACLs on, a request without a token is the anonymous token with no
  rights: writes get 403 ``Permission denied``, listings come back empty
  (without ``X-Consul-Results-Filtered-By-ACLs``), and KV reads get 403
  (Consul answers a denied recursive KV read with 404); the restricted token
  gets 403 on session and KV reads, where Consul would filter by its
  (absent) session and key rules;
* ``/v1/catalog/register`` validation errors are 400 (Consul: 500), and a dev
  agent's own node cannot be written through the catalog (see
  :mod:`.registration`);
* check output changes are written at once (a Consul agent may hold an
  output-only change back for up to 5 minutes), so a blocking query may return
  more often; a return is never a promise of change in Consul either;
* a stopped node keeps its services (as a client agent with a data dir does)
  and its reaper pauses until it is started again.

Checked against HashiCorp Consul 1.8.7
--------------------------------------
The discovery and node-agent suites run against both (the ``consul_kind``
fixture of ``tests/conftest.py``, :mod:`hvd_elastic.local.realconsul`).  What
that found, and what became of it:

====================================  ==========================================  ==================================
difference                            shown by                                    now
====================================  ==========================================  ==================================
a TTL check across an agent restart   ``tests/discovery/test_two_consuls.py``     fixed here: only an update whose
keeps only an unexpired update                                                    TTL lasts survives, else critical
answers over 2 KiB are chunked; the   ``test_transport_body_framings`` (chunked,  fixed in ``hvd_elastic.consul``:
client waited for the close           kept open)                                  it stops at the last chunk
an agent's check change reaches the   ``test_ttl_expires_when_the_agent_stops``   kept: the dev agent is at once;
catalog a moment later (anti-entropy)                                             tests wait for what they assert
a dead agent is marked critical after ``ConsulCluster.stop_node``                 kept: the harness waits for it
gossip's failure detection (~1-2 s)
a follower's ``X-Consul-LastContact`` ``test_stale_reads_are_bounded_by_last_...``  kept: dev agent only (marked
lag is simulated                                                                  ``dev_agent_only``)
1.8.7 filters a restricted token's    ``test_consul_1_8_7_filters_without_...``   kept: the dev agent answers as
rows but sends no ``X-Consul-Results-                                             Consul's API docs describe;
Filtered-By-ACLs`` header                                                         README names the rules needed
a server's loss is a leader election  ``tests/discovery/test_consul_quorum.py``   kept: the dev agent is one
(~15 s at Consul's default Raft       (3 servers; also on the bed:                process, with no quorum to lose;
timing); reads fail cleanly meanwhile ``test_consul_leader_loss.py``)             real Consul only
a follower's ``?stale`` answer may    ``test_consul_quorum.py`` (the stale test   kept: the dev agent keeps one
lack a write the leader committed     waits until every server's own copy has     copy; ``--stale`` documents that
(a majority has it, not yet all)      the hosts before it kills the leader)       a follower's answer can lag
====================================  ==========================================  ==================================
"""

from .cluster import DevCluster

__all__ = ["DevCluster"]
