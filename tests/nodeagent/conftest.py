"""Fixtures of the node-agent tests: the dev Consul cluster and node-agent processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

# The process and HTTP helpers are shared with the discovery tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "discovery"))

from consul_testing import HVD_ELASTIC, clean_env  # noqa: E402

from hvd_elastic.devagent import DevCluster  # noqa: E402


@pytest.fixture
def cluster():
    with DevCluster(nodes=["localhost", "127.0.0.1"]) as c:
        yield c


class NodeAgents:
    """Starts ``hvd-elastic node-agent`` processes; stops whatever is left at teardown."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen] = []

    def start(self, addr: str, *args: str, env: dict[str, str] | None = None, name: str = "agent") -> subprocess.Popen:
        env = env or clean_env(self.tmp_path, CONSUL_HTTP_ADDR=addr)
        log = open(self.tmp_path / f"{name}.{len(self.procs)}.log", "w")
        proc = subprocess.Popen(
            [str(HVD_ELASTIC), "--log-level", "INFO", "node-agent", "--probe", "memory", "--min-free-memory", "1K", *args],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        proc.log_path = log.name
        log.close()
        self.procs.append(proc)
        return proc

    @staticmethod
    def log(proc: subprocess.Popen) -> str:
        return Path(proc.log_path).read_text()

    @staticmethod
    def terminate(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        os.killpg(proc.pid, sig)
        return proc.wait(timeout=timeout)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def node_agents(tmp_path):
    agents = NodeAgents(tmp_path)
    try:
        yield agents
    finally:
        agents.close()
