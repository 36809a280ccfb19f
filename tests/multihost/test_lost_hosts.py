"""Lost hosts on the bed: a partition or a freeze costs seconds, not the Gloo timeout, with OpenSSH's defaults.

Three netns hosts over real ssh WITHOUT keep-alives (``ssh_keepalive=False``),
HashiCorp Consul, node agents with a 3 s TTL, and ``HOROVOD_GLOO_TIMEOUT_SECONDS=60``:
without the lost-host cut (:mod:`hvd_elastic.health.lost`) such a job trains no
step at the smaller size for as long as the host stays away.  Each wait for the
smaller world is bounded below the Gloo timeout, so a job that waited for Gloo or
for its ssh session fails the test; each job then ends with the fault matrix's
checks (exact data, identical state, no corrupt checkpoint).
"""

from __future__ import annotations

import time

import pytest

from testbed.multihost import ElasticCluster

from test_fault_matrix import COOLDOWN, finish_and_check, one_host_fault, resets, victim_host

pytestmark = [pytest.mark.slow, pytest.mark.multihost]

GLOO_TIMEOUT = 60
BELOW_GLOO = GLOO_TIMEOUT - 5  # recovery takes TTL + grace + a reset (about 6 s); this is the hang guard
HANG_GUARD = 3 * GLOO_TIMEOUT + 60


@pytest.fixture
def cluster(tmp_path):
    with ElasticCluster(tmp_path, hosts=3, ttl=3.0, gloo_timeout=GLOO_TIMEOUT, ssh_keepalive=False) as c:
        c.wait_discovered(["hvdtb1:1", "hvdtb2:1", "hvdtb3:1"])
        yield c


def test_partition_without_keepalives_and_heal(cluster, reliability):
    one_host_fault(cluster, reliability, "partition, no ssh keep-alives, Gloo 60 s", cluster.bed.partition,
                   cluster.bed.heal, after=3, horovodrun_args=COOLDOWN, guard=BELOW_GLOO, guard_after=HANG_GUARD)


def test_freeze_then_kill_without_keepalives(cluster, reliability):
    one_host_fault(cluster, reliability, "freeze then kill, no ssh keep-alives, Gloo 60 s", cluster.bed.freeze,
                   lambda host: (cluster.bed.crash(host), cluster.bed.thaw(host)), after=2, guard=BELOW_GLOO,
                   guard_after=HANG_GUARD)


def test_freeze_then_thaw_without_keepalives(cluster, reliability):
    """The thawed host's stale workers die with their hung-up connections; cooled down, the host rejoins."""
    one_host_fault(cluster, reliability, "freeze then thaw, no ssh keep-alives, Gloo 60 s", cluster.bed.freeze,
                   cluster.bed.thaw, after=3, horovodrun_args=COOLDOWN, guard=BELOW_GLOO, guard_after=HANG_GUARD)


@pytest.mark.parametrize("fault, step_s", [("drain", 5), ("node agent dies", 10)])
def test_a_slow_step_is_never_cut(cluster, reliability, fault, step_s):
    """A drained host, or one whose node agent died (critical in Consul) while its workers train on, during
    a long step: it leaves at the next commit, without a hang-up or a rollback.  Killed right after a
    commit, the node agent's TTL expires and the grace ends well inside the 10 s step: the reaper and
    every survivor judge the host lost, and both see it is not stalled."""
    job = cluster.start_job(3, 2, 3, "--step-sleep", str(step_s), "--samples", "36")
    cluster.wait_steps(job, size=3, steps=1, timeout=BELOW_GLOO)
    host = victim_host(cluster, job, 3)
    began = time.time()
    cluster.drain(host) if fault == "drain" else cluster.stop_agent(host)
    cluster.wait_steps(job, size=2, steps=1, since=began, timeout=BELOW_GLOO)
    events = finish_and_check(cluster, job, reliability, f"{fault} during a {step_s} s step, Gloo 60 s")
    log = job.read_log()
    watcher = "".join(p.read_text() for p in (job.out / "discovery-state").rglob("*.log"))
    assert "Gloo connections" not in log, log[-3000:]
    assert "ended horovodrun's" not in watcher, watcher[-3000:]
    assert resets(events)[0] == ("hosts_updated", 3, 2), resets(events)
    assert "restore" not in [e["event"] for e in events]
    if fault == "node agent dies":
        assert f"host {host} failed its health checks in Consul" in watcher and "but it still answers" in watcher, \
            watcher[-3000:]
        assert "not cutting while Gloo traffic flows" in log, log[-3000:]
