"""``hvd-elastic doctor --launcher torchrun`` on the dev agent and HashiCorp Consul: each torchrun line says what
is true (the backend torchrun would load, the token's rights under the key prefix, a closed run id, the health
gate's answer for this node), and bad values are one line and exit 2."""

from __future__ import annotations

import pickle
import subprocess
import sys
import uuid

import pytest
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

from hvd_elastic.cli import build_parser
from hvd_elastic.commands import doctor
from hvd_elastic.consul import api
from hvd_elastic.consul.config import ConsulConfig
from hvd_elastic.local.realconsul import consul_cluster
from testbed import REPO
from testbed.consul import consul_request
from tests.torchrun.test_rdzv_backend import backend


@pytest.fixture(autouse=True)
def _no_consul_env(monkeypatch):
    for name in ("CONSUL_HTTP_ADDR", "CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE", "CONSUL_HTTP_SSL",
                 "HVD_ELASTIC_SERVICE"):
        monkeypatch.delenv(name, raising=False)


def parse(*flags: str):
    return build_parser(only="doctor").parse_args(["doctor", "--launcher", "torchrun", *flags])


def lines(findings) -> dict[str, doctor.Finding]:
    return {finding.name: finding for finding in findings}


def test_torchrun_finds_our_backend_on_this_torch():
    finding = doctor.check_torchrun(parse())
    assert finding.ok, finding
    assert finding.detail.startswith("--rdzv-backend consul (hvd_elastic.torchrun.plugin:handler_creator) on torch ")


def test_the_token_may_write_under_the_prefix_and_the_probe_leaves_nothing(consul):
    addr = consul.addr("localhost")
    prefix = f"doctor-{uuid.uuid4().hex[:8]}"
    found = lines(doctor.check_rendezvous(parse("--rdzv-endpoint", addr, "--rdzv-conf", f"key_prefix={prefix}")))
    assert found["rdzv"].ok and found["rdzv"].detail == f"can write and delete keys under {prefix}/ at http://{addr}"
    assert "run" not in found  # no --rdzv-id, no run to look at
    status, _ = consul_request(addr, "GET", f"/v1/kv/{prefix}/?keys")
    assert status == 404  # no key left under the prefix


def test_a_closed_run_id_fails_naming_how_to_reuse_it_and_an_open_one_passes(consul):
    addr = consul.addr("localhost")
    run_id = f"job-{uuid.uuid4().hex[:8]}"
    assert lines(doctor.check_rendezvous(parse("--rdzv-endpoint", addr, "--rdzv-id", run_id)))["run"].detail == (
        f"--rdzv-id={run_id!r} is new: the first agent creates its state")
    ours = backend(addr, run_id)
    state = _RendezvousState()
    state.round, state.participants = 3, {_NodeDesc("node-a", 1, 1): 0, _NodeDesc("node-b", 1, 1): 1}
    ours.set_state(pickle.dumps(state))
    run = lines(doctor.check_rendezvous(parse("--rdzv-endpoint", addr, "--rdzv-id", run_id)))["run"]
    assert run.ok and run.detail == f"--rdzv-id={run_id!r} is open: round 3, 2 node(s) in it"
    state.closed = True
    _, token = ours.get_state()
    ours.set_state(pickle.dumps(state), token)
    run = lines(doctor.check_rendezvous(parse("--rdzv-endpoint", addr, "--rdzv-id", run_id)))["run"]
    assert (run.ok, run.required) == (False, True)
    assert run.fix.endswith(f"consul kv delete -recurse hvd-elastic/torchrun/{run_id}/")


def test_the_gate_line_follows_the_node_agents_instance(consul):
    addr = consul.addr("localhost")
    cfg = ConsulConfig.from_env({}, addr=addr)
    service = f"svc{uuid.uuid4().hex[:8]}"

    def gate(mode: str = "auto") -> doctor.Finding:
        return lines(doctor.check_rendezvous(
            parse("--rdzv-endpoint", addr, "--rdzv-conf", f"service={service},health_gate={mode}")))["gate"]

    none = gate()  # no node agent: admitted, with a warning that drains do not reach torchrun
    assert (none.label, none.required) == ("warn", False), none
    assert "no instance of service" in none.detail and none.fix == doctor.NODE_AGENT_FIX
    assert (gate("true").label, gate("true").required) == ("FAIL", True)
    assert gate("false").ok and gate("false").detail.startswith("off (health_gate=false)")
    api.register_service(cfg, {"ID": service, "Name": service,
                               "Check": {"CheckID": f"service:{service}", "TTL": "60s", "Status": "passing"}})
    try:
        assert gate().ok and gate().detail.startswith("admitted: "), gate()
        api.set_maintenance(cfg, service, True, "disk swap")
        drained = gate()
        assert (drained.label, drained.required) == ("FAIL", True)
        assert drained.detail.startswith(f"kept out: {service} instance {service} is maintenance"), drained
    finally:
        api.deregister_service(cfg, service)


def test_a_token_without_key_rights_fails_the_rdzv_line_naming_the_policy(consul_kind, monkeypatch, tmp_path):
    admin, reader = f"admin-{uuid.uuid4().hex}", str(uuid.uuid4())
    with consul_cluster(consul_kind, ["localhost"], acl_token=admin, restricted_token=reader,
                        restricted_node_prefixes=[""], restricted_service_prefixes=["horovod"]) as cluster:
        (tmp_path / "token").write_text(reader)
        (tmp_path / "token").chmod(0o600)
        monkeypatch.setenv("CONSUL_HTTP_TOKEN_FILE", str(tmp_path / "token"))
        rdzv = lines(doctor.check_rendezvous(parse("--rdzv-endpoint", cluster.addr("localhost"))))["rdzv"]
    assert (rdzv.label, rdzv.required) == ("FAIL", True)
    assert "403" in rdzv.detail and rdzv.detail.startswith("cannot write hvd-elastic/torchrun/.doctor-")
    assert rdzv.fix.startswith('give the agents\' token write on key_prefix "hvd-elastic/torchrun/"')


@pytest.mark.parametrize("flags, message", [
    (["--rdzv-conf", "key_prefix"], "argument --rdzv-conf: 'key_prefix' is not KEY=VALUE,... (as torchrun's "
                                    "--rdzv-conf)"),
    (["--launcher", "mpirun"], "argument --launcher: invalid choice: 'mpirun' (choose from 'horovodrun', "
                               "'torchrun')"),
])
def test_bad_flags_are_one_line_and_exit_2(flags, message):
    result = subprocess.run([sys.executable, "-m", "hvd_elastic.cli", "doctor", "--launcher", "torchrun", *flags],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines()[-1].endswith(message), result.stderr


def test_a_bad_rendezvous_value_is_a_setting_failure_exit_2(tmp_path):
    result = subprocess.run([sys.executable, "-m", "hvd_elastic.cli", "doctor", "--launcher", "torchrun",
                             "--checkpoint-dir", str(tmp_path), "--min-free-gib", "0", "--rdzv-id", "none",
                             "--rdzv-endpoint", "127.0.0.1:1"], capture_output=True, text=True, cwd=REPO,
                            timeout=300)
    assert result.returncode == 2, result
    rdzv = next(line for line in result.stdout.splitlines() if " rdzv " in line)
    assert rdzv.startswith("FAIL  rdzv       --rdzv-id is torchrun's default 'none'"), rdzv
    # No Horovod, MPI or ssh line under torchrun.
    assert not any(line.split()[1] in ("horovod", "mpi", "ssh") for line in result.stdout.splitlines()), result.stdout
    assert result.stderr.strip().splitlines()[-1].startswith("hvd-elastic doctor: error: ")


def test_a_state_of_another_kind_is_named_not_unpickled(consul):
    addr = consul.addr("localhost")
    run_id = f"job-{uuid.uuid4().hex[:8]}"
    api.kv_put(ConsulConfig.from_env({}, addr=addr), f"hvd-elastic/torchrun/{run_id}/state", {"format": 99})
    run = lines(doctor.check_rendezvous(parse("--rdzv-endpoint", addr, "--rdzv-id", run_id)))["run"]
    assert (run.label, run.required) == ("FAIL", True) and "holds no rendezvous state" in run.detail, run
