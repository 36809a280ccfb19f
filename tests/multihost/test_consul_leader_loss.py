"""A Consul leader election under a training job: three real servers on the bed, the leader SIGKILLed mid-run.

While the survivors elect another leader, discovery fails (horovodrun keeps
its hosts) and the workers' health cut cannot read the catalog; neither may
take a healthy host out of the job.  The job must train on at its full size
through the election and the killed server's return, and end with the fault
matrix's checks (:func:`test_fault_matrix.finish_and_check`).  The election's
seconds are printed, never asserted.
"""

from __future__ import annotations

import time

import pytest

from testbed.multihost import ElasticCluster

from test_fault_matrix import HANG_GUARD, finish_and_check, resets

pytestmark = [pytest.mark.slow, pytest.mark.multihost]


def test_the_leaders_loss_drops_no_host(tmp_path, reliability):
    with ElasticCluster(tmp_path, hosts=2, ttl=3.0, consul_servers=3) as cluster:
        cluster.wait_discovered(["hvdtb1:1", "hvdtb2:1"])
        job = cluster.start_job(2, 2, 2)
        cluster.wait_steps(job, size=2, steps=5)
        old = cluster.consul.wait_leader()
        began, killed = time.time(), time.monotonic()
        cluster.consul.stop_server(old)
        new = cluster.consul.wait_leader(timeout=HANG_GUARD)
        elected = time.monotonic()
        cluster.wait_discovered(["hvdtb1:1", "hvdtb2:1"], timeout=HANG_GUARD)
        print(f"\nkilled leader {old}: {new} leads after {elected - killed:.1f} s, discovery answers after "
              f"{time.monotonic() - killed:.1f} s")
        cluster.consul.start_server(old)
        cluster.wait_steps(job, size=2, steps=5, since=time.time(), timeout=HANG_GUARD)
        events = finish_and_check(cluster, job, reliability, "Consul leader SIGKILL (3 servers)")
        # No reset at all from the kill on: no host left the job, none was even suspected.
        assert not [e for e in events if e["event"] == "reset" and e["time"] > began], resets(events)
