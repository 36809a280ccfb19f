"""A host that freezes must cost seconds, not the Gloo timeout: real elastic horovodrun on local hosts.

``localhost`` and ``127.0.0.1`` are two dev-Consul nodes, each with its node
agent (TTL 2 s); horovodrun discovers them through ``discovery/consul_hosts``
and trains :mod:`testbed.worker` with ``HOROVOD_GLOO_TIMEOUT_SECONDS=600``.
A "frozen host" is SIGSTOP of 127.0.0.1's node agent and of its workers: they
hold their sockets and never answer.  Every job must end with exact data and
identical parameters (:func:`hvd_elastic.report.ledger.verdict`).  The waits are
hang guards far below the Gloo timeout: a job that waited for Gloo could not
meet them.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from testbed import (CONSUL_HOSTS, HVD_ELASTIC, JsonLines, Job, child_env, horovodrun_elastic, start_dev_agent,
                     start_node_agent)
from testbed.lifecycle import Closing
from hvd_elastic.report.ledger import verdict
from hvd_elastic.training.events import EventLog

pytestmark = pytest.mark.slow

GLOO_TIMEOUT = "600"
GUARD = 120.0  # far below the Gloo timeout: the test fails if a collective waited for it
AGENT_ARGS = ("--slots", "1", "--ttl", "2", "--interval", "0.5", "--probe", "memory", "--min-free-memory", "1K")


class LocalJob(Closing):
    """Dev Consul + two node agents + elastic horovodrun of the testbed worker, all torn down on exit."""

    def __init__(self, tmp_path: Path, *worker_args: str, **env: str):
        self.tmp = tmp_path
        self.out = tmp_path / "job"
        self.out.mkdir()
        self.progress = JsonLines(self.out / "progress.jsonl")
        self.worker_args = worker_args
        self.extra_env = env
        self.jobs: list[Job] = []

    def open(self) -> None:
        consul, self.addrs = start_dev_agent(["localhost", "127.0.0.1"], env=child_env(), logdir=self.tmp)
        self.jobs.append(consul)
        self.agents = {node: start_node_agent("--http-addr", addr, *AGENT_ARGS, env=child_env(), logdir=self.tmp,
                                              name=f"agent.{node}") for node, addr in self.addrs.items()}
        self.jobs.extend(self.agents.values())
        self.env = child_env(discovery_state=self.tmp / "discovery-state", CONSUL_HTTP_ADDR=self.addrs["localhost"],
                             HOROVOD_GLOO_TIMEOUT_SECONDS=GLOO_TIMEOUT, HOROVOD_ELASTIC_TIMEOUT="120",
                             **self.extra_env)
        cmd = [*horovodrun_elastic(f"{CONSUL_HOSTS} --http-addr {self.addrs['localhost']}", 2, 1, 2),
               sys.executable, "-m", "testbed.worker", "--out", str(self.out), "--samples", "128",
               "--num-workers", "0", *self.worker_args]
        self.job = Job(cmd, env=self.env, logdir=self.tmp, name="horovodrun")
        self.jobs.append(self.job)
        self.job.start()

    def close(self) -> None:
        for pid in self.worker_pids("127.0.0.1"):  # a frozen worker the test left behind
            with_suppress_kill(pid)
        for job in reversed(self.jobs):
            job.kill()

    def steps(self, size: int, since: float = 0.0) -> int:
        return sum(1 for r in self.progress.rows() if r["size"] == size and r["time"] > since)

    def wait_steps(self, size: int, steps: int, since: float = 0.0, timeout: float = GUARD) -> None:
        self.job.wait_until(f"{steps} steps at size {size}", lambda: self.steps(size, since) >= steps, timeout)

    def worker_pids(self, host: str) -> list[int]:
        pids = []
        for path in (self.out / "pids").glob("*.json"):
            try:
                row = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if row["host"] == host and psutil.pid_exists(row["pid"]):
                pids.append(row["pid"])
        return pids

    def freeze(self, host: str, sig: int = signal.SIGSTOP) -> None:
        """SIGSTOP (or SIGCONT) the host: its node agent and every worker process on it."""
        self.agents[host].signal(sig)
        for pid in self.worker_pids(host):
            for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
                proc.send_signal(sig)

    def hvd_elastic(self, host: str, *args: str) -> None:
        result = subprocess.run([str(HVD_ELASTIC), *args, "--http-addr", self.addrs[host]], env=self.env,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr

    def finish(self) -> list[dict]:
        """Stop at the next epoch end; check exactly-once and identical state; the event log."""
        (self.out / "stop").touch()
        self.job.finish(GUARD)
        result = verdict(self.out)
        assert result.problems() == [], result
        return EventLog.read(self.out / "events.jsonl")

    def watcher_log(self) -> str:
        return "".join(p.read_text() for p in (self.tmp / "discovery-state").rglob("*.log"))


def with_suppress_kill(pid: int) -> None:
    try:
        psutil.Process(pid).kill()
    except psutil.Error:
        pass


def resets(events: list[dict]) -> list[tuple]:
    return [(e["reason"], e["old_size"], e["new_size"]) for e in events if e["event"] == "reset"]


def test_a_frozen_host_is_cut_loose_and_the_job_trains_on_without_waiting_for_gloo(tmp_path):
    with LocalJob(tmp_path, "--step-sleep", "0.05") as run:
        run.wait_steps(2, 10)
        frozen = time.time()
        run.freeze("127.0.0.1")
        run.wait_steps(1, 5, since=frozen)
        events = run.finish()
        log, watcher = run.job.read_log(), run.watcher_log()
    assert "host 127.0.0.1 failed its health checks in Consul" in watcher, watcher
    assert "ended horovodrun's 1 worker session(s)" in watcher, watcher
    assert "Gloo connections so the job restores" in log, log[-4000:]
    assert ("internal_error", 2, 1) in resets(events), resets(events)


def test_survivors_leave_their_collective_without_the_launchers_reaper(tmp_path):
    # Without the reaper horovodrun waits in its rendezvous for the frozen workers until they end; the
    # survivors still leave their collective at once and restore.  (A thawed host's stale worker meets
    # Horovod's own rendezvous rules then; the bed's freeze-then-thaw test runs the full configuration.)
    with LocalJob(tmp_path, "--step-sleep", "0.05", HVD_ELASTIC_HEALTH_REAP="0") as run:
        run.wait_steps(2, 10)
        run.freeze("127.0.0.1")
        # The frozen host may hold rank 0, which writes the event log: the survivor's own output tells.
        run.job.wait_until("the survivor's hang-up and its Horovod's failure",
                           lambda: "Gloo connections so the job restores" in (log := run.job.read_log())
                           and "Horovod background loop uncaught exception" in log, GUARD)
        died = time.time()
        for pid in run.worker_pids("127.0.0.1"):  # the host dies: horovodrun sees its worker end
            with_suppress_kill(pid)
        run.wait_steps(1, 5, since=died)
        events = run.finish()
    assert ("internal_error", 2, 1) in resets(events), resets(events)


def test_a_drain_during_a_5s_step_is_never_cut(tmp_path):
    with LocalJob(tmp_path, "--step-sleep", "5", "--samples", "48") as run:
        run.wait_steps(2, 1)
        drained = time.time()
        run.hvd_elastic("127.0.0.1", "drain", "--reason", "test")
        run.wait_steps(1, 1, since=drained)
        events = run.finish()
        log = run.job.read_log()
    assert "Gloo connections so the job restores" not in log
    assert resets(events) and all(r[0] == "hosts_updated" for r in resets(events)), resets(events)
    assert "restore" not in [e["event"] for e in events]
