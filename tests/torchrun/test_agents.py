"""Real torchrun agents (``torch.distributed.run``) rendezvousing through Consul: ``--rdzv-backend consul``.

Three agents on one machine, each its own node (``--local-addr`` 127.0.0.1-3, one worker each), on the dev
agent and on HashiCorp Consul.

* Two form a world of 2 (``--nnodes 2:3``); a third joins and the world is 3 without a restart counted
  against ``--max-restarts``; the third agent is SIGKILLed and the two left form a world of 2 again; all
  workers stop together and both agents exit 0.
* Each node a Consul node of its own with its node agent's instance registered: ``hvd-elastic drain`` on one
  takes it out (a world of 2, no restart counted on the others, its agent alive without workers), and
  ``undrain`` brings it back (a world of 3).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from hvd_elastic.local.realconsul import consul_cluster
from testbed import HVD_ELASTIC, Job, JsonLines, child_env
from testbed.consul import register

pytestmark = pytest.mark.slow

WORKER = Path(__file__).parent / "worker_gloo.py"
CONF = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=5,join_timeout=120"
WAIT = 180.0  # hang guards, not speed bounds


def agent(tmp_path: Path, addr: str, consul_addr: str, run_id: str, conf: str = CONF) -> Job:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2:3", "--nproc-per-node", "1",
           "--rdzv-backend", "consul", "--rdzv-endpoint", consul_addr, "--rdzv-id", run_id, "--rdzv-conf", conf,
           "--local-addr", addr, "--max-restarts", "3", "--monitor-interval", "0.5", str(WORKER)]
    env = child_env(OUT=str(tmp_path), AGENT_ADDR=addr, OMP_NUM_THREADS="1")
    return Job(cmd, env=env, logdir=tmp_path, name=f"agent-{addr}")


def worlds(rows: JsonLines, addr: str) -> list[tuple[int, int]]:
    """(size, restart) of each run of steps by ``addr``'s worker, in order."""
    seen: list[tuple[int, int]] = []
    for row in sorted((r for r in rows.rows() if r["addr"] == addr), key=lambda r: r["time"]):
        if not seen or seen[-1] != (row["size"], row["restart"]):
            seen.append((row["size"], row["restart"]))
    return seen


def test_agents_form_grow_and_shrink_through_consul(consul_kind, tmp_path):
    run_id = f"job-{uuid.uuid4().hex[:8]}"
    rows = JsonLines(tmp_path / "rows.*.jsonl")
    with consul_cluster(consul_kind, ["localhost"]) as cluster:
        addr = cluster.addr("localhost")
        first, second, third = (agent(tmp_path, f"127.0.0.{n}", addr, run_id) for n in (1, 2, 3))
        with first, second, third:
            first.start()
            second.start()
            first.wait_until("a world of 2", lambda: (2, 0) in worlds(rows, "127.0.0.1"), timeout=WAIT)
            third.start()
            first.wait_until("a world of 3", lambda: any(s == 3 for s, _ in worlds(rows, "127.0.0.1")), timeout=WAIT)
            grown = worlds(rows, "127.0.0.1")[-1]
            assert grown[1] == 0, f"a join counted as a restart: {worlds(rows, '127.0.0.1')}"
            before = len(worlds(rows, "127.0.0.1"))
            third.kill()
            first.wait_until("a world of 2 after the kill", lambda: len(seen := worlds(rows, "127.0.0.1")) > before
                             and seen[-1][0] == 2, timeout=WAIT)
            (tmp_path / "stop").touch()
            assert first.wait(timeout=WAIT) == 0, first.log_tail()
            assert second.wait(timeout=WAIT) == 0, second.log_tail()
    sizes = [size for size, _ in worlds(rows, "127.0.0.1")]
    assert sizes[0] == 2 and 3 in sizes and sizes[-1] == 2, worlds(rows, "127.0.0.1")


def test_a_drained_node_leaves_without_a_counted_restart_and_comes_back_undrained(consul_kind, tmp_path):
    run_id = f"job-{uuid.uuid4().hex[:8]}"
    rows = JsonLines(tmp_path / "rows.*.jsonl")
    with consul_cluster(consul_kind, ["n1", "n2", "n3"]) as cluster:
        for node in ("n1", "n2", "n3"):
            register(cluster.addr(node))
        agents = [agent(tmp_path, f"127.0.0.{n}", cluster.addr(f"n{n}"), run_id, CONF + ",health_gate=true")
                  for n in (1, 2, 3)]
        first, second, third = agents
        with first, second, third:
            for job in agents:
                job.start()
            first.wait_until("a world of 3", lambda: (3, 0) in worlds(rows, "127.0.0.1"), timeout=WAIT)
            drained = subprocess.run([str(HVD_ELASTIC), "drain", "--reason", "test", "--http-addr", cluster.addr("n3")],
                                     env=child_env(), capture_output=True, text=True, timeout=60)
            assert drained.returncode == 0, drained.stderr
            first.wait_until("a world of 2 after the drain", lambda: worlds(rows, "127.0.0.1")[-1] == (2, 0),
                             timeout=WAIT)
            assert worlds(rows, "127.0.0.2")[-1] == (2, 0) and third.running()
            undrained = subprocess.run([str(HVD_ELASTIC), "undrain", "--http-addr", cluster.addr("n3")],
                                       env=child_env(), capture_output=True, text=True, timeout=60)
            assert undrained.returncode == 0, undrained.stderr
            first.wait_until("a world of 3 again", lambda: worlds(rows, "127.0.0.1")[-1] == (3, 0), timeout=WAIT)
            (tmp_path / "stop").touch()
            for job in agents:
                assert job.wait(timeout=WAIT) == 0, job.log_tail()
    assert [size for size, _ in worlds(rows, "127.0.0.1")] == [3, 2, 3], worlds(rows, "127.0.0.1")
