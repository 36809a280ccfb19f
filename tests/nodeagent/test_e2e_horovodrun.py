"""End to end: real elastic horovodrun whose membership changes ONLY through Consul.

Two local hosts (``localhost`` and ``127.0.0.1``) are two dev-Consul nodes.
horovodrun discovers hosts with ``discovery/consul_hosts``; the test never
touches a host file, it only starts and freezes node agents and drains and
undrains a node.  Workers (``worker_sizes.py``) log the world size at every
step; the test asserts the sequence of sizes and that the surviving worker
never rolled back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed import CONSUL_HOSTS, HVD_ELASTIC, Job, WorldSizes, child_env, horovodrun_elastic

pytestmark = pytest.mark.slow

WORKER = Path(__file__).parent / "worker_sizes.py"


def test_membership_follows_consul(cluster, node_agents, tmp_path):
    local, other = cluster.addr("localhost"), cluster.addr("127.0.0.1")
    env = child_env(discovery_state=tmp_path / "discovery-state", CONSUL_HTTP_ADDR=local)
    agent_args = ("--slots", "1", "--ttl", "2", "--interval", "0.3")
    node_agents.start(local, *agent_args, name="localhost")

    job_env = dict(env, SIZES_DIR=str(tmp_path), HOROVOD_GLOO_TIMEOUT_SECONDS="20", HOROVOD_ELASTIC_TIMEOUT="90")
    cmd = [*horovodrun_elastic(f"{CONSUL_HOSTS} --http-addr {local}", 2, 1, 2), sys.executable, WORKER]
    job = Job(cmd, env=job_env, logdir=tmp_path, name="horovodrun")
    sizes = WorldSizes(tmp_path / "sizes.*.jsonl")

    def then(size: int, action) -> None:
        """Do ``action``, then wait until rank 0 trains at ``size``."""
        since = time.time()
        action()
        sizes.wait_for_size(job, size, timeout=90, since=since)

    def hvd(*args: str) -> None:
        result = subprocess.run([str(HVD_ELASTIC), *args, "--http-addr", other], env=env, capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 0, result.stderr

    with job:
        job.start()
        # horovodrun waits for a second host (it needs two to pick a network
        # interface) until the node agent of 127.0.0.1 starts.
        other_agent = node_agents.start(other, *agent_args, name="127.0.0.1")
        sizes.wait_for_size(job, 2, timeout=90)
        then(1, lambda: hvd("drain", "--reason", "e2e"))  # drained: graceful shrink
        then(2, lambda: hvd("undrain"))  # undrained: grows again
        then(1, lambda: other_agent.signal(signal.SIGSTOP))  # the node goes silent: its TTL check fails
        other_agent.kill()
        then(2, lambda: node_agents.start(other, *agent_args, name="127.0.0.1-again"))  # a node agent starts: grow
        (tmp_path / "stop").touch()
        assert job.wait(timeout=120) == 0, job.log_tail()

    # Discovery recognised the job's first call: one marker, keyed by the horovodrun process.
    markers = os.listdir(env["HVD_ELASTIC_DISCOVERY_STATE_DIR"])
    assert len(markers) == 1 and markers[0].startswith(f"{job.pid}-"), markers
    horovod_log = job.log_tail()
    rows = sizes.rows()
    assert sizes.sequence() == [2, 1, 2, 1, 2], horovod_log
    survivor = next(r["pid"] for r in rows if r["host"] == "localhost")  # lives through every change
    assert {r["host"] for r in rows if r["pid"] == survivor} == {"localhost"}
    survivor_steps = [r["step"] for r in rows if r["pid"] == survivor and r["event"] == "step"]
    assert survivor_steps == sorted(survivor_steps), "the survivor's step counter went backwards (rollback)"
    assert not [r for r in rows if r["pid"] == survivor and r["event"] == "restore"], "a graceful change rolled back"
    # Worlds of two had both ranks stepping, one on each host; worlds of one ran on localhost only.
    pairs = [r for r in rows if r["event"] == "step" and r["size"] == 2]
    assert {r["rank"] for r in pairs} == {0, 1} and {r["host"] for r in pairs} == {"localhost", "127.0.0.1"}
    assert {r["host"] for r in rows if r["event"] == "step" and r["size"] == 1} == {"localhost"}
