"""``node-agent --standby NAME``: a node is announced only once its standby can start a worker at once.

Real processes on both Consuls: a node agent, the discovery script, and an
``hvd-elastic standby``; the node agent finds the standby through the same
``HVD_ELASTIC_STANDBY_DIR`` as the launcher would.
"""

from __future__ import annotations

import time

from testbed import Job, child_env, start_node_agent, wait_until
from testbed.consul import run_discovery
from hvd_elastic.local.realconsul import consul_cluster
from testbed.standby import StandbyProcess

WAIT = 120.0  # hang guard: the standby's imports on a loaded machine


def agent(tmp_path, env, *args: str) -> Job:
    return start_node_agent("--probe", "memory", "--min-free-memory", "1K", "--slots", "1", "--ttl", "3",
                            "--interval", "0.5", *args, env=env, logdir=tmp_path, name="node-agent")


def test_the_node_waits_for_its_standby_and_stays_when_the_standby_dies(consul_kind, tmp_path):
    sockets = tmp_path / "sockets"
    with consul_cluster(consul_kind, ["localhost"]) as cluster:
        env = child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR=cluster.addr("localhost"),
                        HVD_ELASTIC_STANDBY_DIR=str(sockets))
        with agent(tmp_path, env, "--standby", "job1", "--standby-wait", "600") as node:
            wait_until("the node's check to say it waits", lambda: "standby job1 not ready yet" in node.read_log(),
                       WAIT, jobs=[node])
            assert run_discovery(env).stdout == ""  # registered, withheld
            with StandbyProcess(tmp_path, "job1", socket_dir=sockets) as standby:
                standby.wait_ready()
                wait_until("the node announced", lambda: run_discovery(env).stdout == "localhost:1\n", WAIT,
                           jobs=[node])
                standby.proc.kill()  # dies: the node must stay in the job
                standby.proc.wait(WAIT)
            time.sleep(2.0)  # four probe rounds with the standby gone
            assert run_discovery(env).stdout == "localhost:1\n"


def test_a_standby_that_never_comes_delays_the_node_by_the_wait_only(consul_kind, tmp_path):
    with consul_cluster(consul_kind, ["localhost"]) as cluster:
        env = child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR=cluster.addr("localhost"),
                        HVD_ELASTIC_STANDBY_DIR=str(tmp_path / "sockets"))
        with agent(tmp_path, env, "--standby", "absent", "--standby-wait", "3") as node:
            wait_until("the node announced", lambda: run_discovery(env).stdout == "localhost:1\n", WAIT, jobs=[node])
            assert "standby 'absent' still not started after 3 s: announcing this node" in node.read_log()
