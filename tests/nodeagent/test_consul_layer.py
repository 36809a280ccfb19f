"""The one Consul client layer as every command meets it: TLS server name, lost checks, structure."""

from __future__ import annotations

import json
import logging
import re
import subprocess
from pathlib import Path

import pytest

from hvd_elastic.consul.config import ConsulConfig
from hvd_elastic.local.realconsul import consul_cluster
from hvd_elastic.nodeagent.loop import NodeAgent, Registration
from hvd_elastic.nodeagent.probes import PASSING, Probe, ProbeResult
from testbed import HVD_ELASTIC, REPO, child_env, start_node_agent, wait_until
from testbed.consul import ScriptedServer, run_discovery, self_signed_cert

WAIT = 30.0  # seconds any one wait may take: a hang guard, not a speed bound
PACKAGE = REPO / "hvd_elastic"


def hvd(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(HVD_ELASTIC), *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_every_command_honours_consul_tls_server_name(tmp_path, consul_kind):
    # The certificate names 127.0.0.1 only; the address says localhost.  Each command must check the
    # certificate against CONSUL_TLS_SERVER_NAME, as the consul CLI does, and fail without it.
    cert, key = self_signed_cert(tmp_path)
    with consul_cluster(consul_kind, ["localhost"], tls_cert=str(cert), tls_key=str(key)) as secured:
        port = secured.addr("localhost").rsplit(":", 1)[1]
        env = child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR=f"https://localhost:{port}", CONSUL_CACERT=str(cert))
        named = dict(env, CONSUL_TLS_SERVER_NAME="127.0.0.1")

        unnamed = hvd(env, "drain")
        assert unnamed.returncode == 1 and "TLS with Consul at" in unnamed.stderr, unnamed.stderr
        agent = start_node_agent("--probe", "memory", "--min-free-memory", "1K", "--slots", "2", "--interval", "0.3",
                                 env=named, logdir=tmp_path, name="agent")
        try:
            wait_until("registration over https by server name",
                       lambda: run_discovery(named).stdout == "localhost:2\n", WAIT)
            assert run_discovery(env).returncode == 1
            drained = hvd(named, "drain")
            assert drained.returncode == 0, drained.stderr
            assert "maintenance" in hvd(named, "status").stdout
            assert hvd(named, "undrain").returncode == 0
            doctor = {line.split()[1]: line
                      for line in hvd(named, "doctor", "--checkpoint-dir", str(tmp_path)).stdout.splitlines()}
            assert doctor["consul"].startswith("ok"), doctor["consul"]
            doctor = {line.split()[1]: line
                      for line in hvd(env, "doctor", "--checkpoint-dir", str(tmp_path)).stdout.splitlines()}
            assert doctor["consul"].startswith("FAIL") and "TLS with Consul at" in doctor["consul"], doctor["consul"]
        finally:
            agent.kill()


def scripted_agent(update_error: str, knows_check: bool) -> ScriptedServer:
    """A Consul agent reduced to what the node agent calls, whose every TTL write fails.

    ``update_error`` is the text of the 500 each ``PUT /v1/agent/check/...`` gets;
    ``knows_check`` decides whether ``GET /v1/agent/checks`` still lists the check.
    """
    checks = {"service:horovod": {"CheckID": "service:horovod", "Status": "passing"}} if knows_check else {}

    def respond(call):
        if call.method == "PUT" and call.path.startswith("/v1/agent/check/"):  # update, pass, warn, fail
            return 500, update_error.encode()
        if call.method == "GET":
            return 200, json.dumps(checks).encode()
        return 200, b""

    return ScriptedServer(respond)


def _config(server: ScriptedServer) -> ConsulConfig:
    host, port = server.addr.rsplit(":", 1)
    return ConsulConfig(host=host, port=int(port))


class Healthy(Probe):
    name = "healthy"

    def check(self) -> ProbeResult:
        return ProbeResult(PASSING, "ok")


def _agent(config: ConsulConfig) -> NodeAgent:
    registration = Registration(service="horovod", service_id="horovod", meta={"slots": "1"}, ttl=3.0)
    return NodeAgent(config, registration, probes=[Healthy()], interval=1.0)


@pytest.mark.parametrize("text", [
    'CheckID "service:horovod" does not have associated TTL',  # Consul 1.x
    "CheckID does not have associated TTL",  # Consul before 1.0: no ID in the text
    "Unknown check ID",  # any other wording
])
def test_lost_check_is_found_by_listing_the_agents_checks_whatever_the_error_text(text):
    with scripted_agent(update_error=text, knows_check=False) as consul:
        agent = _agent(_config(consul))
        agent.register(ProbeResult(PASSING, "ok"))
        assert agent.report(ProbeResult(PASSING, "ok")) is False  # so tick() registers again
        assert "GET /v1/agent/checks" in consul.calls


def test_a_refused_update_of_a_known_check_is_an_error_not_a_reregistration(caplog):
    with scripted_agent(update_error="rpc error: No cluster leader", knows_check=True) as consul:
        agent = _agent(_config(consul))
        with caplog.at_level(logging.WARNING, logger="hvd_elastic.nodeagent"):
            agent.tick()
        registrations = [call for call in consul.calls if call.startswith("PUT /v1/agent/service/register")]
        assert len(registrations) == 1  # the first one only
        assert "No cluster leader" in caplog.text


def _imports(path: Path) -> list[str]:
    return re.findall(r"^\s*(?:from|import)\s+([\w.]+)", path.read_text(), re.MULTILINE)


def test_the_node_agent_imports_no_discovery_internals():
    found = {str(p.relative_to(PACKAGE)): m for p in (PACKAGE / "nodeagent").glob("*.py")
             for m in _imports(p) if m.startswith("hvd_elastic.discovery")}
    assert found == {}


# The Consul client side has ONE transport; the dev agent's own server and its HTTP health checks
# (Consul calling a user's service) are not Consul clients.  The reaper's check of a lost host
# (discovery/host_answers.py) waits for an sshd's greeting, not Consul; join-ahead's
# (training/_internal/rendezvous.py) talks to horovodrun's rendezvous server.  (The test bed's request
# helper, testbed/consul.py, is deliberately an independent client, the oracle tests check our layer
# against; it is outside the package, so outside this check.)
CLIENT_MODULES = {"http.client", "urllib.request", "requests", "consul", "httpx", "aiohttp"}
NOT_CLIENTS = {"devagent/checks.py", "discovery/host_answers.py", "training/_internal/rendezvous.py"}


def test_one_consul_transport():
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        name = str(path.relative_to(PACKAGE))
        if name in NOT_CLIENTS or name.startswith("consul/"):
            continue
        clients = sorted(m for m in _imports(path) if m in CLIENT_MODULES)
        if clients or "create_connection(" in path.read_text():
            offenders[name] = clients or ["socket.create_connection"]
    assert offenders == {}


@pytest.mark.slow
def test_the_node_agent_follows_a_token_file_rotated_in_place(tmp_path, consul_kind):
    good = "mgmt-token-for-this-test"
    token_file = tmp_path / "consul-token"

    def write_token(token: str) -> None:  # atomically, as Vault Agent and consul-template do
        tmp = tmp_path / "consul-token.new"
        tmp.write_text(token + "\n")
        tmp.chmod(0o600)
        tmp.replace(token_file)

    write_token("expired-" + good)
    with consul_cluster(consul_kind, ["localhost"], acl_token=good) as cluster:
        env = child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR=cluster.addr("localhost"),
                        CONSUL_HTTP_TOKEN_FILE=str(token_file))
        agent = start_node_agent("--probe", "memory", "--min-free-memory", "1K", "--slots", "3", "--interval", "0.3",
                                 env=env, logdir=tmp_path, name="agent")
        try:
            wait_until("the refusal to be logged", lambda: "refused access (403" in agent.read_log(), WAIT)
            write_token(good)  # no restart
            wait_until("registration with the rotated token",
                       lambda: run_discovery(env).stdout == "localhost:3\n", WAIT)
            assert "expired-" not in agent.read_log() and good not in agent.read_log()
        finally:
            agent.kill()
