"""Elastic training under real Slurm daemons: the job grows and shrinks with its worker allocations.

``scripts/slurm/launcher.sbatch`` and ``worker.sbatch``, as shipped, submitted
with ``sbatch`` to ``slurmctld``/``slurmd`` on the netns bed
(:mod:`testbed.slurm`), train :mod:`testbed.worker`
with Consul discovery.  A node is in the job exactly while a worker
allocation holds it; preemption (``scancel --signal=TERM``, what slurmctld
sends) and ``scontrol update state=drain`` take it out without a rollback,
and the run must still pass the fault matrix's verdict.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from hvd_elastic.report.ledger import verdict
from testbed.slurm import SCRIPTS, SlurmCluster
from hvd_elastic.training.events import EventLog

pytestmark = pytest.mark.slow

GLOO_TIMEOUT = 60  # no frozen or cut-off host here; a newcomer starting under load must not time the job out (issue 21)
HANG_GUARD = 180  # seconds any one wait may take: a hang guard, not a speed bound


def _victim(cluster, job, size: int) -> str:
    """A host running a rank other than 0 (rank 0 writes the event log)."""
    return next(w["host"] for w in cluster.workers(job) if w["size"] == size and w["rank"] != 0)


def test_launcher_without_arguments_is_refused():
    done = subprocess.run(["bash", str(SCRIPTS / "launcher.sbatch")], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "no horovodrun arguments" in done.stderr


@pytest.mark.multihost
def test_job_grows_with_allocations_and_shrinks_on_preemption_and_drain_without_rollback(tmp_path, capsys):
    with SlurmCluster(tmp_path, hosts=3, ttl=3.0, gloo_timeout=GLOO_TIMEOUT) as slurm:
        elastic = slurm.elastic
        workers = {host: slurm.submit_worker(host) for host in ("hvdtb1", "hvdtb2")}
        elastic.wait_discovered(["hvdtb1:1", "hvdtb2:1"], timeout=HANG_GUARD)
        for job in workers.values():
            assert job.info()["JobState"] == "RUNNING" and job.info()["NodeList"] in ("hvdtb1", "hvdtb2")
        launcher = slurm.submit_launcher(2, 1, 3)
        elastic.wait_steps(launcher, size=2, steps=5, timeout=HANG_GUARD)

        grown = time.time()
        workers["hvdtb3"] = slurm.submit_worker("hvdtb3")  # the queue hands the job another node
        elastic.wait_steps(launcher, size=3, steps=3, since=grown, timeout=HANG_GUARD)

        victim = _victim(elastic, launcher, 3)
        preempted = time.time()
        slurm.preempt(workers[victim])
        first = elastic.wait_steps(launcher, size=2, since=preempted, timeout=HANG_GUARD)
        left = workers[victim].wait_ended(HANG_GUARD)
        assert (left["JobState"], left["ExitCode"]) == ("COMPLETED", "0:0"), left
        agent_log = workers[victim].read_log()
        assert "the job has left this node" in agent_log, agent_log[-3000:]

        drained_host = _victim(elastic, launcher, 2)
        drained = time.time()
        slurm.drain(drained_host, reason="hardware check")
        elastic.wait_steps(launcher, size=1, steps=3, since=drained, timeout=HANG_GUARD)
        assert "DRAIN" in slurm.node_state(drained_host)

        final = slurm.stop(launcher, timeout=HANG_GUARD)
        assert (final["JobState"], final["ExitCode"]) == ("COMPLETED", "0:0"), launcher.read_log()[-4000:]

        result = verdict(launcher.out)
        assert not result.problems(), result.problems()
        events = EventLog.read(launcher.out / "events.jsonl")
        resets = [(e["reason"], e["old_size"], e["new_size"]) for e in events if e["event"] == "reset"]
        assert resets == [("hosts_updated", 2, 3), ("hosts_updated", 3, 2), ("hosts_updated", 2, 1)], resets
        rollbacks = [e for e in events if e["event"] == "restore"]
        assert not rollbacks, f"a preemption or drain rolled back: {rollbacks}"
        figure = {"preemption_to_first_step_s": round(first["time"] - preempted, 2), "rollbacks": len(rollbacks),
                  "samples_lost": result.lost, "samples_duplicated": result.duplicated}
        (tmp_path / "preemption.json").write_text(json.dumps(figure))
        with capsys.disabled():
            print(f"\nslurm preemption: {figure}")
