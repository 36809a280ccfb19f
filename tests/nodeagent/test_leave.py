"""Draining and then waiting for the job to leave: ``drain --wait`` and ``node-agent --leave-timeout``.

A "worker" here is a real process carrying the environment horovodrun gives
its workers (``HOROVOD_HOSTNAME``...), which is all :mod:`hvd_elastic.nodeagent.leave`
looks at; the jobs that really leave a node are in tests/slurm and the fault matrix.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from hvd_elastic.nodeagent import leave
from testbed import HVD_ELASTIC, child_env, wait_until
from testbed.consul import consul_request, refused_address, run_discovery

# drain --wait and --leave-timeout read the whole process table: another test's workers would count as this
# node's (tests/conftest.py).
pytestmark = pytest.mark.serial

WAIT = 30.0  # a hang guard, not a speed bound


def hvd(env, *args, timeout=90):
    return subprocess.run([str(HVD_ELASTIC), *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def fake_worker():
    """Start processes that look like Horovod workers to the process table; all killed at teardown."""
    procs: list[subprocess.Popen] = []

    def start(**marker: str) -> subprocess.Popen:
        env = {**os.environ, **(marker or {"HOROVOD_HOSTNAME": "localhost", "HOROVOD_RANK": "0"})}
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_local_workers_sees_processes_with_horovods_environment_only(fake_worker):
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        worker = fake_worker()
        gloo = fake_worker(HOROVOD_GLOO_RENDEZVOUS_ADDR="10.0.0.1")
        wait_until("the workers to be seen", lambda: {worker.pid, gloo.pid} <= set(leave.local_workers()), WAIT)
        assert plain.pid not in leave.local_workers() and os.getpid() not in leave.local_workers()
    finally:
        plain.kill()
        plain.wait()


def test_wait_for_leave_returns_what_is_left_at_the_deadline_and_nothing_once_gone():
    seen = iter([[7, 8], [8], [8], [8], [8], [8], [8], [8], [8], [8], [8], [8]])
    noticed = []
    assert leave.wait_for_leave(0.3, poll=0.05, workers=lambda: next(seen), on_wait=noticed.append) == [8]
    assert noticed == [[7, 8]]
    gone = iter([[5], []])
    assert leave.wait_for_leave(10, poll=0.01, workers=lambda: next(gone)) == []
    assert leave.wait_for_leave(0, workers=lambda: []) == []


@pytest.mark.slow
def test_drain_wait_exits_3_while_a_worker_runs_and_0_once_it_is_gone(cluster, node_agents, tmp_path, fake_worker):
    addr = cluster.addr("localhost")
    env = child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR=addr)
    node_agents.start(addr, "--slots", "1", "--ttl", "3")
    wait_until("the node to be listed", lambda: run_discovery(env).stdout == "localhost:1\n", WAIT)
    worker = fake_worker()
    wait_until("the worker to be seen", lambda: worker.pid in leave.local_workers(), WAIT)

    stuck = hvd(env, "drain", "--wait", "1")
    assert stuck.returncode == 3, stuck
    assert "still running after 1s: pids" in stuck.stderr and str(worker.pid) in stuck.stderr
    assert run_discovery(env).stdout == ""  # drained all the same

    waiter = subprocess.Popen([str(HVD_ELASTIC), "drain", "--wait", "60"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    assert waiter.poll() is None, waiter.communicate()  # still waiting for the worker
    worker.kill()
    out, err = waiter.communicate(timeout=WAIT)
    assert waiter.returncode == 0, err
    assert out.endswith("the job has left this node\n")


def test_drain_wait_without_consul_fails_at_once_and_bad_wait_is_refused(tmp_path, fake_worker):
    fake_worker()
    with refused_address() as nobody:
        started = time.monotonic()
        result = hvd(child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR=nobody), "drain", "--wait", "300")
        assert result.returncode == 1 and "reach" in result.stderr, result
        assert time.monotonic() - started < 60  # did not wait for workers of a node it could not drain
    bad = hvd(child_env(discovery_state=tmp_path), "drain", "--wait", "soon")
    assert bad.returncode == 2 and "--wait" in bad.stderr and "'soon'" in bad.stderr


def _listed_agent_and_worker(cluster, node_agents, tmp_path, fake_worker, leave_timeout: str):
    """A node agent with ``--leave-timeout``, its node listed, and a worker running here: (addr, env, agent, worker)."""
    addr = cluster.addr("localhost")
    env = child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR=addr)
    agent = node_agents.start(addr, "--slots", "1", "--ttl", "3", "--leave-timeout", leave_timeout)
    wait_until("the node to be listed", lambda: run_discovery(env).stdout == "localhost:1\n", WAIT)
    worker = fake_worker()
    wait_until("the worker to be seen", lambda: worker.pid in leave.local_workers(), WAIT)
    return addr, env, agent, worker


@pytest.mark.slow
def test_node_agent_drains_on_sigterm_and_deregisters_once_the_job_left(cluster, node_agents, tmp_path, fake_worker):
    addr, env, agent, worker = _listed_agent_and_worker(cluster, node_agents, tmp_path, fake_worker, "60")
    agent.signal(signal.SIGTERM)
    wait_until("the drain", lambda: run_discovery(env).stdout == "", WAIT)
    _, services = consul_request(addr, "GET", "/v1/agent/services")
    assert "horovod" in services and agent.running()  # drained, not deregistered: the job is still here
    worker.kill()
    assert agent.wait(WAIT) == 0
    _, services = consul_request(addr, "GET", "/v1/agent/services")
    assert "horovod" not in services
    log = agent.read_log()
    assert "waiting up to 60s for the job to leave" in log and "the job has left this node" in log


@pytest.mark.slow
def test_node_agent_leave_timeout_bounds_the_stop(cluster, node_agents, tmp_path, fake_worker):
    addr, _, agent, worker = _listed_agent_and_worker(cluster, node_agents, tmp_path, fake_worker, "2")
    agent.signal(signal.SIGTERM)
    assert agent.wait(WAIT) == 0
    assert "still running after 2s" in agent.read_log() and str(worker.pid) in agent.read_log()
    _, services = consul_request(addr, "GET", "/v1/agent/services")
    assert "horovod" not in services


def test_workers_of_another_network_namespace_are_another_node(fake_worker):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for a network namespace")
    env = {**os.environ, "HOROVOD_HOSTNAME": "elsewhere", "HOROVOD_RANK": "1"}
    other = subprocess.Popen(["unshare", "--net", sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        here = fake_worker()
        wait_until("the local worker to be seen", lambda: here.pid in leave.local_workers(), WAIT)
        # unshare execs the worker itself: same pid, its own network namespace
        wait_until("the other node's worker to start",
                   lambda: os.readlink(f"/proc/{other.pid}/ns/net") != os.readlink("/proc/self/ns/net"), WAIT)
        assert other.pid not in leave.local_workers()
    finally:
        other.kill()
        other.wait()
