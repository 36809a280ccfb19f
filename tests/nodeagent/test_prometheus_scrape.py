"""A real Prometheus scrapes a real elastic job and its node agents, through a drain and a worker kill.

Two local hosts (``localhost`` and ``127.0.0.1``) are two Consul nodes (the dev
agent, then HashiCorp Consul), each with a node agent serving its metrics and
advertising the port as ``Meta.metrics_port``.  Prometheus finds the node
agents as the README's ``prometheus.yml`` does (``consul_sd_configs`` on the
service, the port from the Meta), and scrapes the job's rank 0 at
``HVD_ELASTIC_METRICS_ADDR``.  The test reads everything back through
Prometheus's HTTP API.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from testbed import (CONSUL_HOSTS, HVD_ELASTIC, Job, WorldSizes, child_env, horovodrun_elastic, ports, prometheus,
                     wait_until)
from hvd_elastic.training.events import EventLog

pytestmark = pytest.mark.slow

WORKER = Path(__file__).parent / "worker_metrics.py"
SCRAPE = "500ms"


def scrape_config(job_port: int, node_targets: dict[str, str]) -> dict:
    """The README's two scrape jobs, with static targets where the README uses ``consul_sd_configs``.

    Debian 12's Prometheus is built without Consul service discovery ("Disable
    Consul SD until its Debian package is back in shape", its changelog), so
    the node agents' targets are the address and ``Meta.metrics_port`` each
    registered, read from Consul's catalog as the README's relabelling reads them.
    """
    return {
        "global": {"scrape_interval": SCRAPE, "scrape_timeout": "400ms", "evaluation_interval": SCRAPE},
        "scrape_configs": [
            {"job_name": "hvd-elastic-job", "static_configs": [{"targets": [f"127.0.0.1:{job_port}"]}]},
            {"job_name": "hvd-elastic-node",
             "static_configs": [{"targets": [target], "labels": {"node": node}}
                                for node, target in node_targets.items()]},
        ],
    }


def registered_targets(consul_addr: str) -> dict[str, str]:
    """node -> ``address:Meta.metrics_port`` of every ``horovod`` instance that advertises one (Consul's catalog)."""
    with urllib.request.urlopen(f"http://{consul_addr}/v1/catalog/service/horovod", timeout=10) as answer:
        entries = json.load(answer)
    return {e["Node"]: f"{e['ServiceAddress'] or e['Address']}:{e['ServiceMeta']['metrics_port']}"
            for e in entries if e["ServiceMeta"].get("metrics_port")}


def test_prometheus_sees_sizes_resets_and_recoveries(cluster, node_agents, tmp_path):
    if reason := prometheus.unavailable_reason():
        pytest.skip(reason)
    local, other = cluster.addr("localhost"), cluster.addr("127.0.0.1")
    job_port, local_metrics, other_metrics = ports.reserve(3)
    env = child_env(discovery_state=tmp_path / "discovery-state", CONSUL_HTTP_ADDR=local)
    agent_args = ("--slots", "1", "--ttl", "2", "--interval", "0.3")
    node_agents.start(local, *agent_args, "--metrics-addr", f"127.0.0.1:{local_metrics}", name="localhost")

    job_env = dict(env, SIZES_DIR=str(tmp_path), HOROVOD_GLOO_TIMEOUT_SECONDS="20", HOROVOD_ELASTIC_TIMEOUT="90",
                   HVD_ELASTIC_METRICS_ADDR=f"127.0.0.1:{job_port}")
    cmd = [*horovodrun_elastic(f"{CONSUL_HOSTS} --http-addr {local}", 2, 1, 2, "--blacklist-cooldown-range", "2", "3"),
           sys.executable, WORKER]
    job = Job(cmd, env=job_env, logdir=tmp_path, name="horovodrun")
    sizes = WorldSizes(tmp_path / "sizes.*.jsonl")

    def hvd(node: str, *args: str) -> None:
        result = subprocess.run([str(HVD_ELASTIC), *args, "--http-addr", cluster.addr(node)], env=env,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr

    node_agents.start(other, *agent_args, "--metrics-addr", f"127.0.0.1:{other_metrics}", name="127.0.0.1")
    targets = wait_until("both node agents to advertise their metrics port",
                         lambda: (t := registered_targets(local)) and len(t) == 2 and t, timeout=30)
    assert sorted(int(t.rsplit(":", 1)[1]) for t in targets.values()) == sorted([local_metrics, other_metrics])
    with prometheus.Prometheus(scrape_config(job_port, targets), tmp_path / "prometheus") as prom, job:
        started = time.time()
        job.start()
        sizes.wait_for_size(job, 2, timeout=90)

        # Both node agents found through Consul, up, registered and passing.
        wait_until("Prometheus to scrape both node agents",
                   lambda: prom.value('count(up{job="hvd-elastic-node"} == 1)') == 2, timeout=60)
        assert prom.value('sum(hvd_elastic_node_registered)') == 2
        assert prom.value('sum(hvd_elastic_node_health{status="passing"})') == 2
        # Every change below is made to the host without rank 0, so rank 0 (and its port) stays put. Which
        # host has it depends on the order discovery listed them; a rank 0 that moves to another process on
        # this machine waits for the old one's port (test_metrics.py covers the series across that move).
        rank0_host = next(r["host"] for r in reversed(sizes.rows()) if r["rank"] == 0 and r["size"] == 2)
        leaver = next(h for h in ("localhost", "127.0.0.1") if h != rank0_host)

        since = time.time()
        hvd(leaver, "drain", "--reason", "metrics test")
        sizes.wait_for_size(job, 1, timeout=90, since=since)
        wait_until("the drained node agent to report maintenance",
                   lambda: prom.value(f'hvd_elastic_node_maintenance{{node="{leaver}"}}') == 1, timeout=30)
        # A scrape during the world of one answers at once (the exporter never waits for training).
        begun = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{job_port}/metrics", timeout=5) as answer:
            body = answer.read()
        assert time.monotonic() - begun < 5 and b"hvd_elastic_world_size 1.0" in body

        since = time.time()
        hvd(leaver, "undrain")
        sizes.wait_for_size(job, 2, timeout=90, since=since)
        time.sleep(2)  # scrapes of this world of two

        # Kill the leaver's worker: a failure reset, then the host comes back after its cooldown.
        victim = next(r["pid"] for r in reversed(sizes.rows()) if r["host"] == leaver and r["size"] == 2)
        since = time.time()
        os.kill(victim, signal.SIGKILL)
        shrunk = sizes.wait_for_size(job, 1, timeout=90, since=since)
        # From the world of one on: a step of the world of two still in flight at the kill is no return.
        sizes.wait_for_size(job, 2, timeout=120, since=shrunk)
        time.sleep(3)  # a few more scrapes of the world of two

        resets = EventLog.read(tmp_path / "events.jsonl", event="reset")
        expected = {"hosts_added": 0, "hosts_removed": 0, "failure": 0}
        for record in resets:
            cause = "failure" if record["reason"] != "hosts_updated" else f"hosts_{record['hosts']}"
            expected[cause] = expected.get(cause, 0) + 1
        wait_until("Prometheus to see every reset",
                   lambda: prom.value("sum(hvd_elastic_resets_total)") == len(resets), timeout=30)
        by_cause = {r["metric"]["cause"]: float(r["value"][1]) for r in prom.query("hvd_elastic_resets_total")}
        wait_until("the last reset's recovery to be observed",
                   lambda: prom.value("hvd_elastic_recovery_seconds_count") == len(resets), timeout=30)
        phases = {r["metric"]["phase"]: float(r["value"][1])
                  for r in prom.query("hvd_elastic_reset_phase_seconds_count")}
        not_training = prom.value("hvd_elastic_not_training_seconds_total")
        ttl_ok = prom.value('sum(hvd_elastic_node_ttl_updates_total{outcome="ok"})')
        stopped = time.time()
        (tmp_path / "stop").touch()
        assert job.wait(timeout=120) == 0, job.log_tail()
        world = [int(v) for _, v in prom.series('hvd_elastic_world_size{job="hvd-elastic-job"}', started, step=0.25)]
        # Every scrape of rank 0 answered, resets included (the target never went down once up).
        up = [v for _, v in prom.series('up{job="hvd-elastic-job"}', started, stopped, step=0.25)]

    # One reset per event, with the right cause: drain (removed), undrain (added), kill (failure),
    # and the killed host's return (added).
    assert by_cause["hosts_removed"] == expected["hosts_removed"] == 1, (by_cause, resets)
    assert by_cause["failure"] == expected["failure"] == 1, (by_cause, resets)
    assert by_cause["hosts_added"] == expected["hosts_added"] >= 2, (by_cause, resets)
    # The world size Prometheus recorded went 2 -> 1 -> 2 -> 1 -> 2, and rank 0 answered every scrape.
    assert [v for i, v in enumerate(world) if i == 0 or v != world[i - 1]] == [2, 1, 2, 1, 2], world
    assert 0.0 not in up[up.index(1.0):], up
    assert {r["host"] for r in sizes.rows() if r["rank"] == 0} == {rank0_host}  # the premise of that check
    # A recovery observation per reset (waited for above), each phase observed once per reset, time lost counted.
    assert phases == dict.fromkeys(("detection", "reinit", "sync", "first_step"), float(len(resets)))
    assert not_training and not_training > 0
    assert ttl_ok and ttl_ok > 10


def test_every_exporter_passes_promtool(cluster, node_agents, tmp_path):
    """``promtool check metrics`` on a scrape of the job's and the node agent's exporters, after a reset."""
    if reason := prometheus.unavailable_reason():
        pytest.skip(reason)
    local = cluster.addr("localhost")
    job_port, agent_port = ports.reserve(2)
    env = child_env(discovery_state=tmp_path / "discovery-state", CONSUL_HTTP_ADDR=local)
    agent_args = ("--slots", "1", "--ttl", "2", "--interval", "0.3")
    node_agents.start(local, *agent_args, "--metrics-addr", str(agent_port), name="localhost")
    node_agents.start(cluster.addr("127.0.0.1"), *agent_args, name="127.0.0.1")  # horovodrun needs two hosts
    job_env = dict(env, SIZES_DIR=str(tmp_path), HVD_ELASTIC_METRICS_ADDR=f":{job_port}")
    cmd = [*horovodrun_elastic(f"{CONSUL_HOSTS} --http-addr {local}", 2, 1, 2), sys.executable, WORKER]
    sizes = WorldSizes(tmp_path / "sizes.*.jsonl")
    with Job(cmd, env=job_env, logdir=tmp_path, name="horovodrun") as job:
        job.start()
        sizes.wait_for_size(job, 2, timeout=90)
        scrapes = {}
        for name, port in (("job", job_port), ("node agent", agent_port)):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
                scrapes[name] = answer.read()
        (tmp_path / "stop").touch()
        assert job.wait(timeout=120) == 0, job.log_tail()
    for name, body in scrapes.items():
        check = prometheus.check_metrics(body)
        assert check.returncode == 0 and not check.stdout.strip(), f"{name}: {check.stdout!r} {check.stderr!r}"
    assert b"hvd_elastic_world_size 2.0" in scrapes["job"]
    assert b'hvd_elastic_node_health{status="passing"} 1.0' in scrapes["node agent"]
