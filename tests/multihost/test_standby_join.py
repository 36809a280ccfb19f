"""A join through the hosts' warm standbys on the bed: netns hosts over real ssh, HashiCorp Consul.

Every host runs ``hvd-elastic standby`` in a socket directory of its own (host-local,
as ``/run/user`` is on real nodes), its node agent announces it only once that
standby answers (``node-agent --standby``), and horovodrun starts every worker as
``hvd-elastic exec --standby bed -- python -m testbed.worker`` over ssh.
A host that boots mid-run joins; the job must end with the fault matrix's checks
(exact data, identical state), every worker must have been forked by its own
host's standby, and none may have fallen back to a direct start.
"""

from __future__ import annotations

import time

import psutil
import pytest

from testbed.multihost import ElasticCluster

from test_fault_matrix import HANG_GUARD, finish_and_check, resets

pytestmark = [pytest.mark.slow, pytest.mark.multihost]


def test_a_host_joins_through_its_standby_and_the_job_trains_exactly_once(tmp_path, reliability):
    with ElasticCluster(tmp_path, hosts=2, standby="bed", preload="psutil") as cluster:
        cluster.wait_discovered(["hvdtb1:1", "hvdtb2:1"], timeout=HANG_GUARD)
        job = cluster.start_job(2, 2, 3)
        cluster.wait_steps(job, size=2, steps=5, timeout=HANG_GUARD)
        booted = time.time()
        joiner = cluster.add_host()  # its standby starts, then its node agent, which waits for it
        cluster.wait_steps(job, size=3, steps=5, since=booted, timeout=HANG_GUARD)
        standby_of = {host: standby.pid for host, standby in cluster.standbys.items()}
        forked_by = {}
        for worker in cluster.workers(job):
            try:
                forked_by[worker["host"]] = psutil.Process(worker["pid"]).ppid()
            except psutil.NoSuchProcess:
                continue
        events = finish_and_check(cluster, job, reliability, "a host joins through its standby")
        log = job.read_log()
    assert forked_by == standby_of and joiner in forked_by, (forked_by, standby_of)
    assert "hvd-elastic exec:" not in log, "a worker fell back to a direct start"
    assert ("hosts_updated", 2, 3) in resets(events), resets(events)
    joins = [e for e in events if e["event"] == "reset" and e.get("hosts") == "added"]
    assert joins and all(e["joined_ahead"] for e in joins), joins  # the survivors trained on meanwhile
    assert "restore" not in [e["event"] for e in events], "a join rolled back"
