"""Launching and breaking real jobs: the one harness of the tests, benchmarks and demo.

* :mod:`.env`    -- the environment a child process gets (venv first on PATH, no
  inherited Consul or hvd-elastic settings, its own discovery state) and where
  the project's programs are.
* :mod:`.job`    -- :class:`Job`: a horovodrun/mpirun/service process tree in its
  own session with a log file; waiting on it, reading it, killing all of it;
  :func:`start_node_agent`, :func:`start_dev_agent`, :func:`wait_until`.
* :mod:`.records` -- reading the JSON-lines files workers write, incrementally;
  :class:`WorldSizes`, the world sizes a rank trained at.
* :mod:`.consul` -- requests to a (dev) Consul agent and discovery runs as horovodrun makes them.
* :mod:`.ledger` -- the exactly-once check over per-sample ledgers, and
  :func:`~.ledger.run_problems`, every promise a finished run must keep.
* :mod:`.netns`  -- :class:`NetnsBed`: several real hosts on one machine (network
  namespaces with their own address, sshd and host name) and the faults it can
  inject on them (crash, freeze, partition).
* :mod:`.multihost` -- :class:`ElasticCluster`: the bed plus the dev Consul agent,
  a node agent in every host and an elastic horovodrun over ssh (drain, TTL expiry,
  host added, Consul outage on top of the bed's faults).
* :mod:`.chaos`  -- :class:`Soak`: one long job under a seeded random stream of
  overlapping faults of every kind above, judged like the fault matrix.
* :mod:`.standby` -- :class:`StandbyProcess`: a real ``hvd-elastic standby`` with its
  own socket directory, and ``hvd-elastic exec`` commands through it.
* :mod:`.worker` -- the training job those run (``python -m hvd_elastic.testbed.worker``),
  writing the ledger, progress and final checksums :mod:`.ledger` judges.

Nothing here is imported by the training or discovery code paths.
"""

from .env import CONSUL_HOSTS, HVD_ELASTIC, MPI_ROOT_ENV, REPO, VENV_BIN, child_env
from .job import (Job, JobError, host_file_discovery, horovodrun_elastic, start_dev_agent, start_node_agent,
                  wait_until)
from .records import JsonLines, WorldSizes

__all__ = ["CONSUL_HOSTS", "HVD_ELASTIC", "MPI_ROOT_ENV", "REPO", "VENV_BIN", "Job", "JobError", "JsonLines",
           "WorldSizes", "child_env", "horovodrun_elastic", "host_file_discovery", "start_dev_agent", "start_node_agent",
           "wait_until"]
