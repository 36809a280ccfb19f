"""``hvd-elastic consul-dev`` as a real subprocess: ready file, node control, signals, bad arguments."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest
from devagent_helpers import Raw, wait_until

from testbed import ports

CLI = [sys.executable, "-m", "hvd_elastic.cli"]


def _free_port_block(count: int) -> int:
    """A base port whose next ``count`` ports are free now (another process may
    still take one before the agent binds it, so a caller retries on the agent's
    "cannot listen")."""
    return ports.reserve(count, consecutive=True)[0]


@pytest.fixture
def agent_process(tmp_path):
    procs = []

    def start(*args, port_taken_ok=False):
        """(process, addresses); addresses None if ``port_taken_ok`` and a port was taken."""
        ready = tmp_path / "ready.json"
        proc = subprocess.Popen([*CLI, "consul-dev", *args, "--ready-file", str(ready)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        procs.append(proc)
        wait_until(lambda: ready.exists() or proc.poll() is not None, timeout=30)
        if proc.poll() is not None:
            stderr = proc.stderr.read()
            if port_taken_ok and proc.returncode == 1 and "cannot listen" in stderr:
                return proc, None
            pytest.fail(f"consul-dev exited with {proc.returncode}: {stderr}")
        return proc, json.loads(ready.read_text())

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_consecutive_ports_ready_file_and_sigterm(agent_process):
    for _ in range(5):
        base = _free_port_block(3)
        proc, addresses = agent_process("--nodes", "gpu-a,gpu-b,gpu-c", "--http-port", str(base), port_taken_ok=True)
        if addresses is not None:
            break
    else:
        pytest.fail("five free port blocks were all taken before consul-dev bound them")
    assert addresses == {"gpu-a": f"127.0.0.1:{base}", "gpu-b": f"127.0.0.1:{base + 1}",
                         "gpu-c": f"127.0.0.1:{base + 2}"}
    for addr in addresses.values():
        assert Raw(addr).json("GET", "/v1/status/leader")[0] == "127.0.0.1:8300"
    assert json.loads(proc.stdout.readline()) == addresses
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    with pytest.raises(OSError):
        Raw(addresses["gpu-a"]).request("GET", "/v1/status/leader", timeout=2)


def test_node_stop_and_start_over_dev_endpoint(agent_process):
    proc, addresses = agent_process("--nodes", "localhost,127.0.0.1", "--http-port", "0")
    a, b = Raw(addresses["localhost"]), Raw(addresses["127.0.0.1"])
    b.request("PUT", "/v1/agent/service/register", {"Name": "w", "Check": {"TTL": "60s", "Status": "passing"}})
    b.request("PUT", "/v1/agent/check/pass/service:w")  # an update is what survives a restart, as in Consul
    assert len(a.json("GET", "/v1/health/service/w?passing")[0]) == 1
    assert a.request("PUT", "/_dev/node/127.0.0.1/stop")[0] == 200
    assert a.json("GET", "/v1/health/service/w?passing")[0] == []
    with pytest.raises(OSError):
        b.request("GET", "/v1/status/leader", timeout=2)
    assert a.json("GET", "/_dev/nodes")[0]["127.0.0.1"]["Running"] is False
    assert a.request("PUT", "/_dev/node/127.0.0.1/start")[0] == 200
    assert len(b.json("GET", "/v1/health/service/w?passing")[0]) == 1  # same port, passing again
    assert a.request("PUT", "/_dev/node/nope/stop")[0] == 404
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=20) == 0


@pytest.mark.parametrize("args, message", [
    (["--nodes", "bad name"], "invalid node name 'bad name'"),
    (["--nodes", "a,a"], "duplicate node name(s): a"),
    (["--tls-cert", "/nonexistent.pem"], "--tls-cert and --tls-key must be given together"),
    (["--acl-token", ""], "--acl-token must not be empty"),
    (["--http-port", "70000"], "http_port 70000 is out of range"),
    (["--acl-restricted-service-prefix", "web"], "need --acl-restricted-token-file"),
    (["--acl-restricted-token-file", "/etc/hostname"], "--acl-restricted-token-file needs --acl-token"),
])
def test_bad_arguments_exit_2(args, message):
    result = subprocess.run([*CLI, "consul-dev", *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_port_in_use_exits_1():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run([*CLI, "consul-dev", "--http-port", str(port)], capture_output=True, text=True,
                                timeout=60)
    assert result.returncode == 1 and "cannot listen" in result.stderr, result.stderr


def test_help_documents_node_control():
    result = subprocess.run([*CLI, "consul-dev", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for text in ("--nodes", "--http-port", "--ready-file", "/_dev/node/<name>/stop", "SIGTERM"):
        assert text in result.stdout


def test_tokens_never_reach_the_logs(tmp_path):
    token = "tok-7f3a9c-never-logged"
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen([*CLI, "--log-level", "DEBUG", "consul-dev", "--http-port", "0", "--acl-token-file",
                             str(token_file), "--ready-file", str(ready)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_until(lambda: ready.exists() or proc.poll() is not None, timeout=30)
        raw = Raw(json.loads(ready.read_text())["localhost"])
        assert raw.request("PUT", f"/v1/kv/a?token={token}", b"x")[0] == 200
        assert raw.request("GET", "/v1/kv/a", headers={"X-Consul-Token": token})[0] == 200
        assert raw.request("GET", "/v1/kv/a", headers={"Authorization": f"Bearer {token}"})[0] == 200
        assert raw.request("GET", "/v1/kv/a", headers={"X-Consul-Token": token + "-wrong"})[0] == 403
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "GET /v1/kv/a -> 403" in stderr  # requests are logged at DEBUG...
    assert token not in stderr  # ...without their tokens
