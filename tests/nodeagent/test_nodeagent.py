"""The node agent, drain/undrain and status as processes against the dev Consul cluster."""

from __future__ import annotations

import signal
import subprocess
import textwrap

import pytest

from hvd_elastic.local.realconsul import consul_cluster
from testbed import HVD_ELASTIC, REPO, child_env, wait_until
from testbed.consul import consul_request, refused_address, register, run_discovery, self_signed_cert

pytestmark = pytest.mark.slow

WAIT = 30.0  # seconds any one wait may take: a hang guard, not a speed bound


def hvd(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(HVD_ELASTIC), *args], env=env, capture_output=True, text=True, timeout=60)


def service_check(addr: str, check_id: str = "service:horovod") -> dict | None:
    code, checks = consul_request(addr, "GET", "/v1/agent/checks")
    return checks.get(check_id) if code == 200 else None


def test_registers_reports_and_deregisters_on_sigterm(cluster, node_agents, tmp_path):
    addr = cluster.addr("localhost")
    env = child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR=addr)
    agent = node_agents.start(addr, "--slots", "2", "--ttl", "3", "--meta", "rack=r7", "--tag", "cpu")
    wait_until("discovery to list the node", lambda: run_discovery(env).stdout == "localhost:2\n", WAIT)
    _, services = consul_request(addr, "GET", "/v1/agent/services")
    meta = services["horovod"]["Meta"]
    assert meta["slots"] == "2" and meta["rack"] == "r7" and int(meta["cpu_count"]) >= 1 and meta["gpu_count"] == "0"
    assert services["horovod"]["Tags"] == ["cpu"]
    check = service_check(addr)
    assert check["Status"] == "passing" and "free memory" in check["Output"]

    assert agent.stop() == 0
    assert consul_request(addr, "GET", "/v1/agent/services")[1] == {}
    assert run_discovery(env).stdout == ""
    log = agent.read_log()
    assert "registered service 'horovod'" in log and "deregistered" in log


def test_probe_failure_and_recovery_through_a_plugin(cluster, node_agents, tmp_path):
    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    flag = tmp_path / "sick"
    (plugin_dir / "flagprobe.py").write_text(textwrap.dedent(f"""
        import os
        from hvd_elastic.nodeagent.probes import CRITICAL, PASSING, Probe, ProbeResult

        class FlagProbe(Probe):
            name = "flag"
            def check(self):
                if os.path.exists({str(flag)!r}):
                    return ProbeResult(CRITICAL, "flag file says sick")
                return ProbeResult(PASSING, "fine")

        def factory(settings):
            return FlagProbe()
    """))
    addr = cluster.addr("localhost")
    env = child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR=addr, PYTHONPATH=str(plugin_dir))
    agent = node_agents.start(addr, "--slots", "1", "--ttl", "3", "--interval", "0.3", "--probe", "flagprobe:factory",
                              env=env)
    wait_until("the node to be listed", lambda: run_discovery(env).stdout == "localhost:1\n", WAIT)
    flag.touch()
    wait_until("the check to turn critical", lambda: (service_check(addr) or {}).get("Status") == "critical", WAIT)
    assert "flag file says sick" in service_check(addr)["Output"]
    assert run_discovery(env).stdout == ""
    status = hvd(env, "status")
    assert status.returncode == 0 and "flag file says sick" in status.stdout and "critical" in status.stdout
    flag.unlink()
    wait_until("the node to come back", lambda: run_discovery(env).stdout == "localhost:1\n", WAIT)
    log = agent.read_log()
    assert "health passing -> critical" in log and "health critical -> passing" in log


def test_disk_probe_threshold_turns_the_node_critical(cluster, node_agents, tmp_path):
    addr = cluster.addr("localhost")
    node_agents.start(addr, "--slots", "1", "--probe", "disk", "--min-free-disk", "1000T",
                      "--checkpoint-path", str(tmp_path))
    wait_until("the first report after registering", lambda: (service_check(addr) or {}).get("Output"), WAIT)
    check = service_check(addr)
    assert check["Status"] == "critical" and "is below 1024000.0 GiB" in check["Output"]
    assert run_discovery(child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR=addr)).stdout == ""


def test_ttl_expires_when_the_agent_stops_and_it_reregisters_after_state_loss(cluster, node_agents, tmp_path):
    addr = cluster.addr("127.0.0.1")
    env = child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR=addr)
    agent = node_agents.start(addr, "--slots", "1", "--ttl", "2", "--interval", "0.3")
    wait_until("the node to be listed", lambda: run_discovery(env).stdout == "127.0.0.1:1\n", WAIT)

    # Frozen agent: no TTL updates, the check expires, discovery drops the node.
    agent.signal(signal.SIGSTOP)
    wait_until("the TTL to expire",
               lambda: (service_check(addr) or {}).get("Output", "").startswith("TTL expired"), WAIT)
    # Real Consul's agent tells its servers a moment later (anti-entropy): the catalog follows.
    wait_until("discovery to drop the node", lambda: run_discovery(env).stdout == "", WAIT)
    agent.signal(signal.SIGCONT)
    wait_until("the node to come back", lambda: run_discovery(env).stdout == "127.0.0.1:1\n", WAIT)

    # The local Consul agent forgets the service (as after a restart without state).
    consul_request(addr, "PUT", "/v1/agent/service/deregister/horovod")
    wait_until("re-registration", lambda: run_discovery(env).stdout == "127.0.0.1:1\n", WAIT)
    assert "registering again" in agent.read_log()

    # The Consul agent itself dies and returns: logged once each way, then healthy again.
    cluster.stop_node("127.0.0.1")
    wait_until("the outage to be logged", lambda: "cannot reach Consul at" in agent.read_log(), WAIT)
    cluster.start_node("127.0.0.1")
    wait_until("recovery after the agent restart", lambda: run_discovery(env).stdout == "127.0.0.1:1\n", WAIT)
    assert agent.read_log().count("cannot reach Consul at") == 1


def test_drain_undrain_and_status(cluster, node_agents, tmp_path):
    addr = cluster.addr("localhost")
    env = child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR=addr)
    node_agents.start(addr, "--slots", "2", "--ttl", "3")
    register(cluster.addr("127.0.0.1"), slots="1")
    wait_until("both nodes listed", lambda: run_discovery(env).stdout == "127.0.0.1:1\nlocalhost:2\n", WAIT)

    drained = hvd(env, "drain", "--reason", "slurm wants it back")
    assert drained.returncode == 0, drained.stderr
    assert drained.stdout == "horovod: in maintenance (slurm wants it back)\n"
    assert run_discovery(env).stdout == "127.0.0.1:1\n"
    status = hvd(env, "status")
    assert status.returncode == 0
    row = next(line for line in status.stdout.splitlines() if line.startswith("localhost "))
    assert "maintenance" in row and "slurm wants it back" in row
    assert status.stdout.endswith("discovery prints (1 hosts, 1 slots):\n  127.0.0.1:1\n")
    assert hvd(env, "drain").returncode == 0  # idempotent

    undrained = hvd(env, "undrain")
    assert (undrained.returncode, undrained.stdout) == (0, "horovod: out of maintenance\n")
    assert run_discovery(env).stdout == "127.0.0.1:1\nlocalhost:2\n"


def test_drain_and_status_failures(cluster, tmp_path):
    env = child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR=cluster.addr("localhost"))
    missing = hvd(env, "drain")
    assert missing.returncode == 1 and "no instance of service 'horovod' is registered" in missing.stderr
    assert hvd(env, "undrain", "--service-id", "nope").returncode == 1
    with refused_address() as nobody:
        dead = child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR=nobody)
        for command in ("drain", "undrain", "status"):
            result = hvd(dead, command)
            assert result.returncode == 1, result
            assert len(result.stderr.strip().splitlines()) == 1 and "reach" in result.stderr
    bad = hvd(child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR="http://:8500"), "drain")
    assert bad.returncode == 2 and "CONSUL_HTTP_ADDR" in bad.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--probe", "nosuchprobe"], "unknown probe 'nosuchprobe'"),
        (["--probe", "nosuchmodule:factory"], "cannot load probe"),
        (["--meta", "bad key=1"], "--meta"),
        (["--meta", "slots=3"], "--slots"),
        (["--min-free-disk", "lots"], "--min-free-disk"),
        (["--deregister-after", "soon"], "--deregister-after"),
        (["--slots", "0"], "--slots"),
    ],
)
def test_node_agent_bad_input_exits_2(tmp_path, args, needle):
    result = hvd(child_env(discovery_state=tmp_path), "node-agent", *args)
    assert result.returncode == 2 and needle in result.stderr, result


def test_explicit_token_wins_over_the_environment(node_agents, tmp_path, consul_kind):
    with consul_cluster(consul_kind, ["localhost"], acl_token="s3cret") as secured:
        addr = secured.addr("localhost")
        env = child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR=addr, CONSUL_HTTP_TOKEN="wrong")
        agent = node_agents.start(addr, "--slots", "1", "--token", "s3cret", env=env)
        ok = child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR=addr, CONSUL_HTTP_TOKEN="s3cret")
        wait_until("registration with the flag's token", lambda: run_discovery(ok).stdout == "localhost:1\n", WAIT)
        assert hvd(env, "drain", "--token", "s3cret").returncode == 0
        denied = hvd(env, "undrain")
        assert denied.returncode == 1 and "403" in denied.stderr
        assert agent.stop() == 0
        assert "s3cret" not in agent.read_log()


def test_slurm_epilog_drains_and_prolog_undrains(cluster, node_agents, tmp_path):
    addr = cluster.addr("localhost")
    env = child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR=addr, HVD_ELASTIC_BIN=str(HVD_ELASTIC),
                    HVD_ELASTIC_NODE_AGENT_UNIT="", HVD_ELASTIC_DRAIN_GRACE="0", SLURM_JOB_ID="4242")
    node_agents.start(addr, "--slots", "1")
    wait_until("the node to be listed", lambda: run_discovery(env).stdout == "localhost:1\n", WAIT)
    epilog = subprocess.run([str(REPO / "scripts/slurm/epilog.sh")], env=env, capture_output=True, text=True,
                            timeout=60)
    assert epilog.returncode == 0, epilog.stderr
    assert run_discovery(env).stdout == ""
    assert "slurm job 4242 ended" in hvd(env, "status").stdout
    prolog = subprocess.run([str(REPO / "scripts/slurm/prolog.sh")], env=env, capture_output=True, text=True,
                            timeout=60)
    assert prolog.returncode == 0, prolog.stderr
    assert run_discovery(env).stdout == "localhost:1\n"


def test_node_agent_drain_and_status_over_tls(node_agents, tmp_path, consul_kind):
    cert, key = self_signed_cert(tmp_path)
    with consul_cluster(consul_kind, ["localhost"], tls_cert=str(cert), tls_key=str(key)) as secured:
        env = child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR=f"https://{secured.addr('localhost')}",
                        CONSUL_CACERT=str(cert))
        node_agents.start("", "--slots", "3", env=env)
        wait_until("registration over https", lambda: run_discovery(env).stdout == "localhost:3\n", WAIT)
        assert hvd(env, "drain").returncode == 0
        assert "maintenance" in hvd(env, "status").stdout
        untrusted = dict(env, CONSUL_CACERT="")
        result = hvd(untrusted, "undrain")
        assert (result.returncode == 1 and result.stderr.count("\n") == 1
                and "TLS with Consul at" in result.stderr), result.stderr


def test_agent_started_before_consul_registers_once_consul_is_up(cluster, node_agents, tmp_path):
    addr = cluster.addr("127.0.0.1")
    cluster.stop_node("127.0.0.1")
    agent = node_agents.start(addr, "--slots", "2", "--ttl", "3", "--interval", "0.3")
    wait_until("the agent to notice Consul is down", lambda: "cannot reach Consul at" in agent.read_log(), WAIT)
    assert agent.running()  # waiting, not dead
    cluster.start_node("127.0.0.1")
    env = child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR=addr)
    wait_until("registration once Consul is up", lambda: run_discovery(env).stdout == "127.0.0.1:2\n", WAIT)
