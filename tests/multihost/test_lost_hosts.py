"""Lost hosts on the bed: a partition or a freeze costs seconds, not the Gloo timeout, with OpenSSH's defaults.

Three netns hosts over real ssh WITHOUT keep-alives (``ssh_keepalive=False``),
HashiCorp Consul, node agents with a 3 s TTL, and ``HOROVOD_GLOO_TIMEOUT_SECONDS=60``:
without the lost-host cut (:mod:`hvd_elastic.discovery.lost`) such a job trains no
step at the smaller size for as long as the host stays away.  Each wait for the
smaller world is bounded below the Gloo timeout, so a job that waited for Gloo or
for its ssh session fails the test; each job then ends with the fault matrix's
checks (exact data, identical state, no corrupt checkpoint).
"""

from __future__ import annotations

import time

import pytest

from hvd_elastic.testbed.multihost import ElasticCluster

from test_fault_matrix import COOLDOWN, finish_and_check, resets, victim_host

pytestmark = [pytest.mark.slow, pytest.mark.multihost]

GLOO_TIMEOUT = 60
LOST_HOSTS_ON = {"HVD_ELASTIC_HEALTH_CUT": "1", "HVD_ELASTIC_HEALTH_REAP": "1"}  # opt-in for now
BELOW_GLOO = GLOO_TIMEOUT - 5  # recovery takes TTL + grace + a reset (about 6 s); this is the hang guard
HANG_GUARD = 3 * GLOO_TIMEOUT + 60


@pytest.fixture
def cluster(tmp_path):
    with ElasticCluster(tmp_path, hosts=3, ttl=3.0, gloo_timeout=GLOO_TIMEOUT, ssh_keepalive=False) as c:
        c.wait_discovered(["hvdtb1:1", "hvdtb2:1", "hvdtb3:1"])
        yield c


def test_partition_without_keepalives_and_heal(cluster, reliability):
    job = cluster.start_job(3, 2, 3, horovodrun_args=COOLDOWN, env=LOST_HOSTS_ON)
    cluster.wait_steps(job, size=3, steps=5)
    host = victim_host(cluster, job, 3)
    cut = time.time()
    cluster.bed.partition(host)
    cluster.wait_steps(job, size=2, steps=3, since=cut, timeout=BELOW_GLOO)
    healed = time.time()
    cluster.bed.heal(host)
    cluster.wait_steps(job, size=3, steps=3, since=healed, timeout=HANG_GUARD)  # healthy again: it rejoins
    events = finish_and_check(cluster, job, reliability, "partition, no ssh keep-alives, Gloo 60 s")
    assert ("internal_error", 3, 2) in resets(events), resets(events)


def test_freeze_then_kill_without_keepalives(cluster, reliability):
    job = cluster.start_job(3, 2, 3, env=LOST_HOSTS_ON)
    cluster.wait_steps(job, size=3, steps=5)
    host = victim_host(cluster, job, 3)
    frozen = time.time()
    cluster.bed.freeze(host)
    cluster.wait_steps(job, size=2, steps=3, since=frozen, timeout=BELOW_GLOO)
    cluster.bed.crash(host)
    cluster.bed.thaw(host)
    cluster.wait_steps(job, size=2, steps=3, since=time.time(), timeout=HANG_GUARD)
    events = finish_and_check(cluster, job, reliability, "freeze then kill, no ssh keep-alives, Gloo 60 s")
    assert ("internal_error", 3, 2) in resets(events), resets(events)
