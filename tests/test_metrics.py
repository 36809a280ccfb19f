"""hvd_elastic.metrics: addresses, the exporter's failure modes, and the job's numbers across ranks and resets."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from hvd_elastic.metrics.address import MetricsAddressError, parse
from hvd_elastic.metrics.exporter import Exporter
from hvd_elastic.metrics.job import JobMetrics
from testbed import child_env, ports


@pytest.mark.parametrize("text, expected", [
    ("9404", ("127.0.0.1", 9404)), (":9404", ("127.0.0.1", 9404)), ("0.0.0.0:80", ("0.0.0.0", 80)),
    ("gpu-node-1.example:9404", ("gpu-node-1.example", 9404)), ("[::1]:9404", ("::1", 9404)),
    ("127.0.0.1:0", ("127.0.0.1", 0)),
])
def test_addresses(text, expected):
    assert parse(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "host:", "host:99999", "host:-1", "a b:80", "-host:80", "http://h:80",
                                  "[::1:80"])
def test_bad_addresses_are_one_line_naming_them(text):
    with pytest.raises(MetricsAddressError) as info:
        parse(text, "--metrics-addr")
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"--metrics-addr={text!r}") and "[HOST]:PORT" in message


def scrape(address) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{address[1]}/metrics", timeout=5) as answer:
        return answer.read()


def job_registry(metrics: JobMetrics) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(metrics)
    return registry


def test_a_port_in_use_or_a_bad_address_is_one_line_and_no_exception(caplog):
    metrics = JobMetrics()
    serving = Exporter(job_registry(metrics), "job")
    assert serving.start("127.0.0.1:0", "x")
    try:
        taken = f"127.0.0.1:{serving.address[1]}"
        other = Exporter(job_registry(JobMetrics()), "job")
        with caplog.at_level(logging.ERROR, logger="hvd_elastic.metrics.exporter"):
            assert not other.start(taken, "HVD_ELASTIC_METRICS_ADDR")
            assert not other.start(taken, "HVD_ELASTIC_METRICS_ADDR")  # retried at the next reset: logged once
            assert not other.start("nonsense", "HVD_ELASTIC_METRICS_ADDR")
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 2 and all("\n" not in line for line in lines), lines
        assert taken in lines[0] and "in use" in lines[0]
        assert "'nonsense'" in lines[1]
        assert other.address is None
        assert b"hvd_elastic_world_size 0.0" in scrape(serving.address)  # the first one serves on
    finally:
        serving.stop()


def test_a_forked_child_does_not_keep_the_port():
    exporter = Exporter(job_registry(JobMetrics()), "job")
    assert exporter.start("127.0.0.1:0", "x")
    port = exporter.address[1]
    pid = os.fork()
    if pid == 0:  # the child outlives the parent's exporter
        time.sleep(30)
        os._exit(0)
    try:
        exporter.stop()
        with socket.socket() as s:  # free again although the child still runs
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_a_new_rank_0_continues_the_series():
    rank0 = JobMetrics()
    rank0.on_world(0, 2)
    rank0.on_commit(0.01, step=10, samples=640, now=100.0)
    rank0.on_commit(0.01, step=11, samples=704, now=101.0)
    rank0.on_reset_begun({"reason": "hosts_updated", "hosts": "added", "notified_at": 101.5,
                          "interrupted_at": 102.0}, now=102.0)
    joiner = JobMetrics()
    joiner.adopt(rank0.carry())  # the sync's broadcast: the joiner now holds the open reset too
    for m in (rank0, joiner):
        m.on_world(1 if m is joiner else 0, 3)
        m.on_sync(0.5, 1000, now=105.0)
        m.on_commit(0.01, step=12, samples=768, now=106.0)
    # Rank 0's host is lost: the joiner is rank 0 now and serves the same numbers.
    def numbers(m):
        lines = generate_latest(job_registry(m)).decode().splitlines()
        return [line for line in lines if not line.startswith(("#", "hvd_elastic_rank "))]
    assert numbers(joiner) == numbers(rank0)
    text = "\n".join(numbers(rank0))
    assert 'hvd_elastic_resets_total{cause="hosts_added"} 1.0' in text
    assert "hvd_elastic_recovery_seconds_count 1.0" in text and "hvd_elastic_recovery_seconds_sum 4.5" in text
    assert "hvd_elastic_not_training_seconds_total 4.5" in text and "hvd_elastic_sync_bytes_total 1000.0" in text
    phases = {p: rank0.phases[p].sum for p in rank0.phases}
    assert phases == pytest.approx({"detection": 0.5, "reinit": 2.5, "sync": 0.5, "first_step": 1.0})
    assert rank0.counters["steps"] == joiner.counters["steps"] == 2 and joiner.counters["samples"] == 128


def test_a_failure_is_detected_from_the_last_commit_and_counted_once():
    m = JobMetrics()
    m.on_commit(0.01, step=5, now=10.0)
    failure = {"reason": "internal_error", "interrupted_at": 40.0}
    m.on_reset_begun(failure, now=40.0)
    m.on_reset_begun(failure, now=41.0)  # a failed sync retried: the same recovery
    m.on_restore(live_step=6, committed_step=5)
    m.on_resumed(now=42.0)  # no sync (every rank kept its state)
    m.on_commit(0.01, step=6, now=43.0)
    assert m.resets["failure"] == 1 and m.counters["steps_rolled_back"] == 1
    assert m.phases["detection"].sum == 30.0 and m.phases["reinit"].sum == 2.0 and m.phases["sync"].sum == 0.0
    assert m.recovery.sum == 33.0 and m.open_reset is None


def test_bad_metrics_address_the_job_still_trains(tmp_path):
    """A single-process ``@hvd_elastic.run`` with a port in use: one line on stderr, and it trains to the end."""
    busy = socket.socket()
    busy.bind(("127.0.0.1", ports.reserve()[0]))
    busy.listen()
    taken = f"127.0.0.1:{busy.getsockname()[1]}"
    script = textwrap.dedent("""
        import horovod.torch as hvd, torch, hvd_elastic
        hvd.init()
        model = torch.nn.Linear(2, 1)
        state = hvd_elastic.TrainingState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), step=0)
        @hvd_elastic.run
        def train(state):
            while state.step < 5:
                state.commit_step()
            return state.step
        print("trained", train(state))
    """)
    try:
        env = child_env(HVD_ELASTIC_METRICS_ADDR=taken)
        result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    finally:
        busy.close()
    assert result.returncode == 0 and result.stdout.strip() == "trained 5", result.stderr
    errors = [line for line in result.stderr.splitlines() if "metrics are off" in line]
    assert len(errors) == 1 and taken in errors[0] and "in use" in errors[0], result.stderr


def test_each_hosts_relative_speed_is_the_last_windows_and_stragglers_are_counted():
    m = JobMetrics()
    m.on_pace({"gpu-a": 1.0, "gpu-b": 0.98, "gpu-c": 0.33}, 0)
    m.on_pace({"gpu-a": 1.02, "gpu-c": 0.32}, 1)  # gpu-b left the world: its series goes
    text = generate_latest(job_registry(m)).decode()
    speeds = sorted(line for line in text.splitlines() if line.startswith("hvd_elastic_host_relative_speed{"))
    assert speeds == ['hvd_elastic_host_relative_speed{host="gpu-a"} 1.02',
                      'hvd_elastic_host_relative_speed{host="gpu-c"} 0.32']
    assert "hvd_elastic_stragglers_reported_total 1.0" in text
    joiner = JobMetrics()
    joiner.adopt(m.carry())  # the count travels with the job's counters; speeds come from the next window
    assert joiner.counters["stragglers_reported"] == 1 and joiner.host_speed == {}
