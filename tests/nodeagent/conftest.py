"""Fixtures of the node-agent tests: a two-node Consul cluster (the dev agent, then real Consul) and node-agent
processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from hvd_elastic.local.realconsul import consul_cluster
from testbed import Job, child_env, start_node_agent


@pytest.fixture
def cluster(consul_kind):
    """Consul (dev agent, then real Consul) with the two local horovodrun hosts as nodes, each its own agent."""
    with consul_cluster(consul_kind, ["localhost", "127.0.0.1"]) as c:
        yield c


class NodeAgents:
    """Starts ``hvd-elastic node-agent`` jobs (memory probe only, 1K free is enough); kills all at teardown."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.jobs: list[Job] = []

    def start(self, addr: str, *args: str, env: dict[str, str] | None = None, name: str = "agent") -> Job:
        env = env or child_env(discovery_state=self.tmp_path, CONSUL_HTTP_ADDR=addr)
        job = start_node_agent("--probe", "memory", "--min-free-memory", "1K", *args, env=env,
                               logdir=self.tmp_path, name=f"{name}.{len(self.jobs)}")
        self.jobs.append(job)
        return job

    def close(self) -> None:
        for job in self.jobs:
            job.kill()


@pytest.fixture
def node_agents(tmp_path):
    agents = NodeAgents(tmp_path)
    try:
        yield agents
    finally:
        agents.close()
