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
from consul_testing import CONSUL_HOSTS, HVD_ELASTIC, VENV_BIN, clean_env
from sizes_log import SizesLog

pytestmark = pytest.mark.slow

WORKER = Path(__file__).parent / "worker_sizes.py"


def test_membership_follows_consul(cluster, node_agents, tmp_path):
    local, other = cluster.addr("localhost"), cluster.addr("127.0.0.1")
    env = clean_env(tmp_path / "discovery-state", CONSUL_HTTP_ADDR=local)
    agent_args = ("--slots", "1", "--ttl", "2", "--interval", "0.3")
    node_agents.start(local, *agent_args, name="localhost")

    job_env = dict(env, SIZES_DIR=str(tmp_path), HOROVOD_GLOO_TIMEOUT_SECONDS="20", HOROVOD_ELASTIC_TIMEOUT="90")
    log = open(tmp_path / "horovodrun.log", "w")
    job = subprocess.Popen(
        [str(VENV_BIN / "horovodrun"), "-np", "2", "--min-np", "1", "--max-np", "2",
         "--host-discovery-script", f"{CONSUL_HOSTS} --http-addr {local}",
         sys.executable, str(WORKER)],
        env=job_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )

    sizes = SizesLog(tmp_path)

    def then(size: int, action) -> None:
        """Do ``action``, then wait until rank 0 trains at ``size``."""
        since = time.time()
        action()
        sizes.wait_for_size(size, job, since=since)

    def hvd(*args: str) -> None:
        result = subprocess.run([str(HVD_ELASTIC), *args, "--http-addr", other], env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr

    try:
        # horovodrun waits for a second host (it needs two to pick a network
        # interface) until the node agent of 127.0.0.1 starts.
        other_agent = node_agents.start(other, *agent_args, name="127.0.0.1")
        sizes.wait_for_size(2, job)
        then(1, lambda: hvd("drain", "--reason", "e2e"))  # drained: graceful shrink
        then(2, lambda: hvd("undrain"))  # undrained: grows again
        then(1, lambda: other_agent.send_signal(signal.SIGSTOP))  # the node goes silent: its TTL check fails
        other_agent.send_signal(signal.SIGKILL)
        other_agent.wait()
        then(2, lambda: node_agents.start(other, *agent_args, name="127.0.0.1-again"))  # a node agent starts: grow
        (tmp_path / "stop").touch()
        assert job.wait(timeout=120) == 0
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        log.close()

    # Discovery recognised the job's first call: one marker, keyed by the horovodrun process.
    markers = os.listdir(env["HVD_ELASTIC_DISCOVERY_STATE_DIR"])
    assert len(markers) == 1 and markers[0].startswith(f"{job.pid}-"), markers
    horovod_log = (tmp_path / "horovodrun.log").read_text()[-4000:]
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
