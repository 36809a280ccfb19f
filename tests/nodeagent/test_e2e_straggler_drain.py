"""End to end, straggler policy ``drain``: a slow host is drained through its node agent and readmitted.

Real elastic horovodrun over two dev-Consul nodes, ``localhost`` (2 slots) and ``127.0.0.1`` (1 slot),
each with its node agent, discovery through Consul only.  The rank on ``127.0.0.1`` is throttled by the
kernel (:func:`tests.training_run.test_pace_jobs.slow_host`): rank 0 finds it slow in 3 windows of 20
commits, asks its node agent to drain it, the job shrinks to ``localhost`` without a rollback; the
throttle is lifted, and after the 6 s cool-down the node agent lifts the drain and the host rejoins.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hvd_elastic.local.realconsul import consul_cluster
from hvd_elastic.training.events import EventLog
from testbed import CONSUL_HOSTS, Job, child_env, horovodrun_elastic, wait_until
from tests.training_run.test_pace_jobs import WORKER, slow_host

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # a cgroup throttle and a judge of pace (tests/conftest.py)

SLOW = "127.0.0.1"
BATCH = 1024
FINISH = 300.0  # a hang guard, not a speed bound


@pytest.fixture
def cluster():
    """The dev agent only: the node agent's Consul calls of a drain are proven on both kinds in
    ``test_straggler_drain.py``; this test is the job's side, minutes long."""
    with consul_cluster("dev", ["localhost", SLOW]) as c:
        yield c


def drained_at(records: list[dict]) -> float:
    return next(e["time"] for e in records if e["event"] == "straggler_drain")


def test_a_slow_host_is_drained_and_readmitted(cluster, node_agents, tmp_path):
    local, other = cluster.addr("localhost"), cluster.addr(SLOW)
    agent_args = ("--ttl", "2", "--interval", "0.3", "--straggler-cooldown", "6s")
    node_agents.start(local, "--slots", "2", *agent_args, name="localhost")
    slow_agent = node_agents.start(other, "--slots", "1", *agent_args, name=SLOW)
    events = tmp_path / "events.jsonl"
    with slow_host(SLOW) as slow_env:
        env = child_env(discovery_state=tmp_path / "discovery-state", CONSUL_HTTP_ADDR=local, EVENT_LOG=str(events),
                        HOROVOD_GLOO_TIMEOUT_SECONDS="60", SAMPLES=str(3 * BATCH * 260), BATCH=str(BATCH),
                        HVD_ELASTIC_STRAGGLER="drain", HVD_ELASTIC_STRAGGLER_WINDOW="20",
                        HVD_ELASTIC_STRAGGLER_WINDOWS="3", STOP_FILE=str(tmp_path / "stop"), **slow_env)
        cmd = [*horovodrun_elastic(f"{CONSUL_HOSTS} --http-addr {local}", 3, 2, 3), sys.executable, str(WORKER)]
        with Job(cmd, env=env, logdir=tmp_path, name="horovodrun") as job:
            job.start()
            log = EventLog.read
            wait_until("the straggler's drain", lambda: events.exists() and any(
                e["event"] == "straggler_drain" for e in log(events)), FINISH, jobs=[job])
            if "SLOW_CGROUP" in slow_env:  # the host is fixed: it rejoins at full speed
                (Path(slow_env["SLOW_CGROUP"]) / "cpu.cfs_quota_us").write_text("-1")
            wait_until("the readmission", lambda: "readmitted service id" in slow_agent.read_log(), FINISH,
                       jobs=[job])
            # Epochs go on until the readmitted host is back in the world (a busy box takes a while to start it).
            wait_until("a world of 3 after the drain", lambda: any(
                e["event"] == "reset" and e.get("new_size") == 3 and e["time"] > drained_at(log(events))
                for e in log(events)), FINISH, jobs=[job])
            (tmp_path / "stop").touch()
            assert job.wait(timeout=FINISH) == 0, job.log_tail()
    records = EventLog.read(events)
    drains = [e for e in records if e["event"] == "straggler_drain"]
    first = drains[0]
    assert (first["slow_host"], first["status"], first["instances"]) == (SLOW, "requested", [f"{SLOW}/horovod"])
    stragglers = [e for e in records if e["event"] == "straggler"]
    assert stragglers[0]["slow_host"] == SLOW and stragglers[0]["policy"] == "drain"
    resets = [e for e in records if e["event"] == "reset"]
    shrink = next(e for e in resets if e["time"] > first["time"])
    # Removed gracefully: no restore of a commit (a rollback) between the drain and the shrink.
    assert (shrink["reason"], shrink["new_size"]) == ("hosts_updated", 2), resets
    assert not [e for e in records if e["event"] == "restore" and e["time"] > first["time"]]
    assert any(e["new_size"] == 3 and e["time"] > shrink["time"] for e in resets), "never readmitted"
    assert "drained service id 'horovod' for the job: host 127.0.0.1 took" in slow_agent.read_log()
