"""The fault matrix: one elastic job per fault on netns hosts reached over real ssh.

Every test runs :mod:`testbed.worker` (TrainingState, ExactlyOnceSampler,
``@hvd_elastic.run`` with checkpoints) under elastic horovodrun on the launcher host,
hosts discovered through ``discovery/consul_hosts`` from node agents inside the
hosts' namespaces, injects its fault, waits for the job to train at the expected
world size, stops it at an epoch boundary and then requires ALL of:

* horovodrun exited 0;
* every rank ended with identical parameter, optimizer and scheduler state;
* the per-sample ledger shows every index exactly once in every completed epoch,
  counting only records whose step key is in the final committed history (the
  rule for rolled-back steps, see :mod:`hvd_elastic.report.ledger`);
* no checkpoint was refused while resuming (none was corrupt) and no write was
  left half-done.

Waits are hang guards, not speed checks: the seconds each fault costs are
measured by ``benchmarks/recovery.py``.
"""

from __future__ import annotations

import json
import time

import pytest

from hvd_elastic.report.ledger import run_problems, verdict
from testbed.multihost import ElasticCluster
from hvd_elastic.training.checkpoint import CheckpointManager
from hvd_elastic.training.events import EventLog

pytestmark = [pytest.mark.slow, pytest.mark.multihost]

GLOO_TIMEOUT = 15  # seconds a collective with a hung or cut-off peer waits (HOROVOD_GLOO_TIMEOUT_SECONDS)
COOLDOWN = ("--blacklist-cooldown-range", "3", "5")  # a failed host may come back once healthy
HANG_GUARD = 3 * GLOO_TIMEOUT + 60  # generous: far above any recovery, far below pytest's timeout


@pytest.fixture
def cluster(tmp_path):
    with ElasticCluster(tmp_path, hosts=3, ttl=3.0, gloo_timeout=GLOO_TIMEOUT) as c:
        c.wait_discovered(["hvdtb1:1", "hvdtb2:1", "hvdtb3:1"])
        yield c


def victim_host(cluster, job, size: int) -> str:
    """A host running a rank other than 0 (rank 0 writes the event log; any other rank will do)."""
    return next(w["host"] for w in cluster.workers(job) if w["size"] == size and w["rank"] == 1)


def finish_and_check(cluster, job, reliability, fault: str) -> list[dict]:
    """Stop the job, then check every promise of the module docstring; returns the event log."""
    cluster.stop(job, timeout=HANG_GUARD)
    result = verdict(job.out)
    problems = run_problems(job.out, result)
    reliability({"fault": fault, "injected": 1, "survived": not problems, "lost": result.lost,
                 "duplicated": result.duplicated, "identical": result.params_identical})
    assert not problems, problems
    events = EventLog.read(job.out / "events.jsonl")
    assert not [e for e in events if e["event"] == "checkpoint_skipped"], "a corrupt checkpoint was met on resume"
    return events


def one_host_fault(cluster, reliability, fault: str, inject, undo, after: int, horovodrun_args=(),
                   guard: float = HANG_GUARD, guard_after: float = HANG_GUARD) -> list[dict]:
    """World of 3: ``inject(host)`` on rank 1's host, train at 2 within ``guard``; ``undo(host)``, train at
    ``after`` within ``guard_after``.

    The loss must be a failure the job rolled back from (an ``internal_error``
    reset 3 -> 2); ends with :func:`finish_and_check`; returns the event log.
    """
    job = cluster.start_job(3, 2, 3, horovodrun_args=horovodrun_args)
    cluster.wait_steps(job, size=3, steps=5)
    host = victim_host(cluster, job, 3)
    began = time.time()
    inject(host)
    cluster.wait_steps(job, size=2, steps=3, since=began, timeout=guard)
    undone = time.time()
    undo(host)
    cluster.wait_steps(job, size=after, steps=3, since=undone, timeout=guard_after)
    events = finish_and_check(cluster, job, reliability, fault)
    assert ("internal_error", 3, 2) in resets(events), resets(events)
    return events


def resets(events: list[dict]) -> list[tuple]:
    return [(e["reason"], e["old_size"], e["new_size"]) for e in events if e["event"] == "reset"]


def test_worker_sigkill(cluster, reliability):
    job = cluster.start_job(3, 2, 3, horovodrun_args=COOLDOWN)
    cluster.wait_steps(job, size=3, steps=5)
    host = victim_host(cluster, job, 3)
    killed = time.time()
    assert cluster.bed.crash(host, match="testbed.worker --out"), f"no worker found on {host}"
    cluster.wait_steps(job, size=2, since=killed, timeout=HANG_GUARD)
    # No survivor waited out the Gloo timeout on another survivor (gloo_hangup; without it, about half the crashes).
    assert "Timed out waiting" not in job.read_log()
    events = finish_and_check(cluster, job, reliability, "worker SIGKILL")
    assert ("internal_error", 3, 2) in resets(events), resets(events)
    assert "restore" in [e["event"] for e in events]


def kill_inside_the_step_collective(cluster, *worker_args: str):
    """A job of 3 in which rank 1 SIGKILLs itself after its optimizer step, before the step's loss allreduce."""
    job = cluster.start_job(3, 2, 3, *worker_args, horovodrun_args=COOLDOWN)
    cluster.wait_steps(job, size=3, steps=3)
    (job.out / "die-after-step").write_text("1 0")  # rank 1, at its next step
    job.wait_until("rank 1 to die after its optimizer step", lambda: not (job.out / "die-after-step").exists(),
                   HANG_GUARD)
    cluster.wait_steps(job, size=2, since=time.time(), timeout=HANG_GUARD)
    return job


def test_peer_sigkill_between_optimizer_step_and_commit(cluster, reliability):
    """The survivors' update of that step is applied when their collective fails: the restore rolls it
    back, so the verdict's step chain, scheduler and optimizer step counts hold."""
    job = kill_inside_the_step_collective(cluster)
    events = finish_and_check(cluster, job, reliability, "peer SIGKILL between step and commit")
    assert ("internal_error", 3, 2) in resets(events), resets(events)


def test_a_broken_restore_fails_the_matrix(cluster):
    """The proof: with a restore() that keeps model, optimizer and scheduler, the same fault applies a
    step twice; ranks still agree and samples are still once, and the verdict must fail anyway."""
    job = kill_inside_the_step_collective(cluster, "--broken-restore")
    cluster.stop(job, timeout=HANG_GUARD)
    result = verdict(job.out)
    assert result.params_identical and result.lost == result.duplicated == 0, result
    problems = "\n".join(result.problems())
    assert "started from a state that is not what step" in problems, problems
    assert "scheduler last_epoch" in problems and "optimizer state step" in problems, problems


def test_all_workers_of_a_host_sigkill(tmp_path, reliability):
    # Two slots on every host: the host's two workers die together, the node agent with them.
    with ElasticCluster(tmp_path, hosts=3, ttl=3.0, gloo_timeout=GLOO_TIMEOUT, slots=2) as cluster:
        cluster.wait_discovered(["hvdtb1:2", "hvdtb2:2", "hvdtb3:2"])
        job = cluster.start_job(6, 2, 6, horovodrun_args=COOLDOWN)
        cluster.wait_steps(job, size=6, steps=5)
        host = victim_host(cluster, job, 6)
        crashed = time.time()
        assert len(cluster.bed.crash(host)) >= 3, "the host's workers and node agent should all be killed"
        cluster.wait_steps(job, size=4, since=crashed, timeout=HANG_GUARD)
        assert "Timed out waiting" not in job.read_log()  # as in test_worker_sigkill
        events = finish_and_check(cluster, job, reliability, "all workers of a host SIGKILL")
    assert any(r[0] == "internal_error" and r[1] == 6 and r[2] < 6 for r in resets(events)), resets(events)


def test_host_frozen_then_killed(cluster, reliability):
    # Survivors leave their collective (the lost-host cut, or the Gloo timeout), then go on without it.
    one_host_fault(cluster, reliability, "host frozen (SIGSTOP) then killed", cluster.bed.freeze,
                   lambda host: (cluster.bed.crash(host), cluster.bed.thaw(host)), after=2)


def test_host_drained_shrinks_without_rollback_and_rejoins(cluster, reliability):
    job = cluster.start_job(3, 2, 3)
    cluster.wait_steps(job, size=3, steps=5)
    host = victim_host(cluster, job, 3)
    drained = time.time()
    cluster.drain(host)
    cluster.wait_steps(job, size=2, steps=3, since=drained, timeout=HANG_GUARD)
    undrained = time.time()
    cluster.undrain(host)
    cluster.wait_steps(job, size=3, steps=3, since=undrained, timeout=HANG_GUARD)
    events = finish_and_check(cluster, job, reliability, "host drained, then undrained")
    assert resets(events)[:2] == [("hosts_updated", 3, 2), ("hosts_updated", 2, 3)], resets(events)
    assert "restore" not in [e["event"] for e in events], "a graceful drain rolled back"


def test_host_added(cluster, reliability):
    job = cluster.start_job(3, 2, 4)
    cluster.wait_steps(job, size=3, steps=5)
    added = time.time()
    new_host = cluster.add_host()
    first = cluster.wait_steps(job, size=4, steps=3, since=added, timeout=HANG_GUARD)
    assert first["size"] == 4
    assert new_host in {w["host"] for w in cluster.workers(job) if w["size"] == 4}
    events = finish_and_check(cluster, job, reliability, "host added")
    assert ("hosts_updated", 3, 4) in resets(events), resets(events)
    assert "restore" not in [e["event"] for e in events]


def test_node_agent_dies_ttl_expiry(cluster, reliability):
    job = cluster.start_job(3, 2, 3)
    cluster.wait_steps(job, size=3, steps=5)
    host = victim_host(cluster, job, 3)
    stopped = time.time()
    cluster.stop_agent(host)
    cluster.wait_steps(job, size=2, steps=3, since=stopped, timeout=HANG_GUARD)
    events = finish_and_check(cluster, job, reliability, "node agent dies (TTL expiry)")
    assert resets(events)[0] == ("hosts_updated", 3, 2), resets(events)
    assert "restore" not in [e["event"] for e in events]


def test_consul_down_20s_and_back(cluster, reliability):
    job = cluster.start_job(3, 2, 3)
    cluster.wait_steps(job, size=3, steps=5)
    down = time.time()
    for node in cluster.consul.nodes:
        cluster.consul.stop_node(node)
    # Discovery fails while Consul is away; horovodrun keeps its hosts and training goes on.
    cluster.wait_steps(job, size=3, steps=10, since=down, timeout=HANG_GUARD)
    time.sleep(max(0.0, 20 - (time.time() - down)))
    for node in cluster.consul.nodes:
        cluster.consul.start_node(node)
    back = time.time()
    cluster.wait_discovered(["hvdtb1:1", "hvdtb2:1", "hvdtb3:1"])
    cluster.wait_steps(job, size=3, steps=5, since=back, timeout=HANG_GUARD)
    events = finish_and_check(cluster, job, reliability, "Consul agents down 20 s and back")
    # An outage longer than the TTL: Consul brings every check back critical until its node agent's
    # next update (a restored check stays out of rotation until it passes), so discovery may catch a
    # host in that moment and the job may resize; never with a rollback, nothing lost (checked above).
    assert all(r[0] == "hosts_updated" for r in resets(events)), resets(events)
    assert "restore" not in [e["event"] for e in events]


def test_partition_of_one_host_and_heal(cluster, reliability):
    # Healthy again in Consul and past the blacklist cooldown, the host rejoins.
    one_host_fault(cluster, reliability, "partition of one host, then heal", cluster.bed.partition, cluster.bed.heal,
                   after=3, horovodrun_args=COOLDOWN)


def test_whole_job_sigkill_mid_checkpoint_write_then_restart(cluster, reliability):
    job = cluster.start_job(3, 2, 3, "--checkpoint-every", "5")
    cluster.wait_steps(job, size=3, steps=12)
    (job.out / "stall-checkpoints").touch()  # the next write stalls before it is durable
    job.wait_until("a stalled checkpoint write", lambda: list((job.out / "ckpt").glob(".tmp-*")), timeout=HANG_GUARD)
    job.kill()
    assert not [p for h in cluster.bed.hosts for p in cluster.bed.processes(h, str(job.out))], \
        "a worker outlived the job kill"
    durable = CheckpointManager(job.out / "ckpt").checkpoints()
    assert durable, "no durable checkpoint before the stalled one"
    newest_step = json.loads(durable[0].read_text())["step"]
    (job.out / "stall-checkpoints").unlink()
    restarted = time.time()
    job.start()
    cluster.wait_steps(job, size=3, steps=5, since=restarted, timeout=HANG_GUARD)
    events = finish_and_check(cluster, job, reliability, "whole job SIGKILL mid-checkpoint-write, restart")
    resumes = [e for e in events if e["event"] == "resume"]
    assert [r["step"] for r in resumes] == [newest_step], resumes  # the newest durable one, not the torn write


def test_survivors_below_min_np_then_a_new_host_arrives(cluster, reliability):
    # Horovod #3494: a graceful leave that drops the world below --min-np must wait, not deadlock.
    job = cluster.start_job(3, 3, 4)
    cluster.wait_steps(job, size=3, steps=5)
    host = victim_host(cluster, job, 3)
    drained = time.time()
    cluster.drain(host)
    time.sleep(5)  # the two survivors wait for a third host
    arrived = time.time()
    cluster.add_host()
    cluster.wait_steps(job, size=3, steps=5, since=arrived, timeout=HANG_GUARD)
    assert not [r for r in cluster.progress(job) if r["time"] > drained and r["size"] < 3], \
        "the job trained below --min-np"
    finish_and_check(cluster, job, reliability, "below --min-np after a drain, then a host joins")


def test_frozen_host_thawed_job_still_finishes(cluster, reliability):
    """A hung host that comes back (SIGCONT) instead of dying: its stale workers must not corrupt the job."""
    one_host_fault(cluster, reliability, "host frozen, then thawed", cluster.bed.freeze, cluster.bed.thaw, after=2,
                   horovodrun_args=COOLDOWN)
