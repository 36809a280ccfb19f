"""The node agent stops, with one line, on what waiting cannot heal, and refuses settings that would make the node
flap; an outage is still only retried.

``hvd-elastic node-agent`` runs in this process (:func:`hvd_elastic.cli.main`) against an in-process dev agent:
each case ends before the agent's loop would start waiting.
"""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from hvd_elastic.cli import main as cli_main
from hvd_elastic.consul import api
from hvd_elastic.consul.config import ConsulConfig
from hvd_elastic.devagent import DevCluster
from hvd_elastic.nodeagent.loop import KEEPER_META, NodeAgent, Registration, process_id, this_process
from testbed.consul import refused_address

AGENT = ("node-agent", "--probe", "memory", "--min-free-memory", "1K")


@pytest.fixture
def node_agent(monkeypatch, capsys):
    """``node_agent(*flags, **env)`` -> (exit code, stderr) of ``hvd-elastic node-agent`` with these flags and,
    of the CONSUL_* and HVD_ELASTIC_* variables, ``env`` only."""

    def run(*flags: str, **env: str) -> tuple[int, str]:
        for name in list(os.environ):
            if name.startswith(("CONSUL_", "HVD_ELASTIC_")):
                monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        try:
            code = cli_main([*AGENT, *flags])
        except SystemExit as exc:
            code = exc.code
        err = capsys.readouterr().err
        assert "Traceback" not in err, err
        return code, err

    return run


@pytest.fixture(scope="module")
def agent():
    with DevCluster(nodes=["gpu-a"]) as cluster:
        yield cluster.addr("gpu-a")


def error(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("hvd-elastic node-agent: error: "), err
    return err[len("hvd-elastic node-agent: error: "):-1]


def test_a_registration_consul_refuses_ends_the_agent(node_agent, agent):
    code, err = node_agent("--http-addr", agent, "--service-id", "refused-400", "--address", "0.0.0.0")
    assert code == 1
    assert error(err) == (f"Consul at http://{agent} rejected the request: 400 Invalid service address; not retrying: "
                          "Consul refused the first registration, and waiting does not change its answer")


def test_a_token_without_the_rights_ends_the_agent(node_agent):
    """A token given as a value cannot change; one from a file may be rotated in place, and is waited for
    (test_consul_layer.py::test_the_node_agent_follows_a_token_file_rotated_in_place)."""
    with DevCluster(nodes=["gpu-a"], acl_token="root", restricted_token="read-only",
                    restricted_service_prefixes=["horovod"]) as cluster:
        code, err = node_agent("--http-addr", cluster.addr("gpu-a"), CONSUL_HTTP_TOKEN="read-only")
    assert code == 1
    message = error(err)
    assert message.startswith(f"Consul at http://{cluster.addr('gpu-a')} refused access (403 "), message
    assert message.endswith("; not retrying: Consul refused the first registration, and waiting does not change its "
                            "answer"), message


def keep(addr: str, service_id: str, keeper: str) -> None:
    """Register ``service_id`` as the node agent of this host whose process is ``keeper`` (PID-START) would."""
    api.register_service(ConsulConfig.from_env({}, addr=addr), {
        "Name": "horovod", "ID": service_id, "Meta": {"slots": "4", "host": socket.gethostname()[:512],
                                                      KEEPER_META: keeper},
        "Check": {"TTL": "300s", "Status": "passing"}})


def test_a_service_id_another_live_agent_keeps_is_refused(node_agent, agent):
    other = subprocess.Popen(["sleep", "60"])
    try:
        keep(agent, "taken", process_id(other.pid))
        code, err = node_agent("--http-addr", agent, "--service-id", "taken", "--slots", "1")
        slots = api.agent_service(ConsulConfig.from_env({}, addr=agent), "taken")["Meta"]["slots"]
    finally:
        other.kill()
        other.wait()
    assert code == 1
    assert error(err) == (f"service ID 'taken' is kept by the node agent pid {other.pid} of this host (Consul at "
                          f"http://{agent}): give this one another --service-id, or stop that one first")
    assert slots == "4"  # the first agent's registration is untouched


def test_the_service_id_of_an_agent_that_died_is_taken_over(agent):
    """A node agent restarted after a crash finds its old registration, kept by a process that is gone."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    keep(agent, "restarted", f"{gone.pid}-1.00")
    config = ConsulConfig.from_env({}, addr=agent)
    registration = Registration(service="horovod", service_id="restarted", ttl=15.0,
                                meta={"slots": "1", "host": socket.gethostname()[:512], KEEPER_META: this_process()})
    node = NodeAgent(config, registration, probes=[], interval=5.0)
    try:
        node.tick()
        assert node.registered
        assert api.agent_service(config, "restarted")["Meta"][KEEPER_META] == this_process()
    finally:
        node.close()


def test_an_unreachable_consul_is_retried_not_fatal():
    with refused_address() as addr:
        node = NodeAgent(ConsulConfig.from_env({}, addr=addr),
                         Registration(service="horovod", service_id="h", ttl=15.0, meta={}), probes=[], interval=5.0)
        node.tick()  # logged and retried at the next tick; no exception
    assert not node.registered


@pytest.mark.parametrize("flags, expected", [
    (["--ttl", "0.1"], "argument --ttl: '0.1' is not a duration of at least 1s (seconds, or e.g. 500ms, 15s, 1m30s)"),
    (["--ttl", "15s", "--interval", "1m"],
     "--interval 60s is more than half of --ttl 15s: the check would expire between updates, or at the first late "
     "one (use --interval 7.5s or less, or a longer TTL)"),
    (["--port", "70000"], "argument --port: '70000' is not a port number (1-65535)"),
    (["--meta", f"{KEEPER_META}=1-2"], f"--meta {KEEPER_META}=... is not allowed: the agent's own"),
])
def test_settings_that_would_make_the_node_flap_are_refused(node_agent, flags, expected):
    code, err = node_agent("--http-addr", "127.0.0.1:1", *flags)
    assert code == 2
    assert error(err) == expected


def test_a_ttl_from_the_environment_is_named_as_the_variable(node_agent):
    code, err = node_agent("--http-addr", "127.0.0.1:1", "--interval", "6", HVD_ELASTIC_TTL="10s")
    assert code == 2
    assert error(err).startswith("--interval 6s is more than half of HVD_ELASTIC_TTL 10s: "), err
