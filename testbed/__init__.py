"""Launching and breaking real jobs: the harness of the tests and benchmarks (not shipped: the wheel has
``hvd_elastic`` only).

Built on what the product itself runs jobs with (:mod:`hvd_elastic.local`: :class:`Job`,
the child environment, Consul clusters, ports; :mod:`hvd_elastic.report`: the JSON-lines
reader and the exactly-once verdict, :mod:`hvd_elastic.report.ledger`), re-exported here
so a test imports its harness from one place.  Test-only:

* :mod:`.env`    -- the product's child environment plus this checkout on ``PYTHONPATH``
  (workers import the bed), ``REPO``, ``MPI_ROOT_ENV``.
* :mod:`.job`    -- :func:`start_dev_agent` (the dev agent as its own process) and
  :func:`host_file_discovery` (Horovod's plain host-file membership).
* :mod:`.records` -- :class:`WorldSizes`, the world sizes a rank trained at.
* :mod:`.consul` -- requests to a (dev) Consul agent, discovery runs as horovodrun makes
  them, and test doubles (:class:`~.consul.ScriptedServer`, self-signed certificates).
* :mod:`.hostcache` -- discovery's host cache under test (a stand-in horovodrun, a counting proxy).
* :mod:`.netns`  -- :class:`NetnsBed`: several real hosts on one machine (network
  namespaces with their own address, sshd and host name) and the faults it can
  inject on them (crash, freeze, partition).
* :mod:`.multihost` -- :class:`ElasticCluster`: the bed plus the dev Consul agent,
  a node agent in every host and an elastic horovodrun over ssh (drain, TTL expiry,
  host added, Consul outage on top of the bed's faults).
* :mod:`.chaos`  -- :class:`Soak`: one long job under a seeded random stream of
  overlapping faults of every kind above, judged like the fault matrix.
* :mod:`.slurm`, :mod:`.prometheus` -- real slurmctld/slurmd and Prometheus on the bed.
* :mod:`.standby` -- :class:`StandbyProcess`: a real ``hvd-elastic standby`` with its
  own socket directory, and ``hvd-elastic exec`` commands through it.
* :mod:`.procs`, :mod:`.lifecycle` -- is a process still there; set-ups that undo themselves.
* :mod:`.worker` -- the training job those run (``python -m testbed.worker``), writing
  the evidence (:mod:`hvd_elastic.report.evidence`) the verdict judges.

Importable where the checkout is on ``sys.path``: pytest (``pythonpath`` in pyproject.toml),
the benchmarks (each puts the checkout there) and every child :func:`child_env` makes.
"""

from hvd_elastic.local import ports
from hvd_elastic.local.job import Job, JobError, horovodrun_elastic, start_node_agent, wait_until
from hvd_elastic.report.jsonlines import JsonLines

from .env import CONSUL_HOSTS, HVD_ELASTIC, MPI_ROOT_ENV, REPO, VENV_BIN, child_env
from .job import host_file_discovery, start_dev_agent
from .records import WorldSizes

__all__ = ["CONSUL_HOSTS", "HVD_ELASTIC", "MPI_ROOT_ENV", "REPO", "VENV_BIN", "Job", "JobError", "JsonLines",
           "WorldSizes", "child_env", "horovodrun_elastic", "host_file_discovery", "ports", "start_dev_agent",
           "start_node_agent", "wait_until"]
