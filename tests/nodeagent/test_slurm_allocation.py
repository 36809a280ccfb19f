"""What the node agent takes from a Slurm allocation, and its probe of the node's Slurm state.

The same code runs under real slurmd in tests/slurm; here each rule is pinned
with exact variables and a scripted ``scontrol``.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from hvd_elastic.nodeagent import slurm
from hvd_elastic.nodeagent.probes import CRITICAL, PASSING, WARNING, ProbeSettings
from testbed import HVD_ELASTIC, child_env, wait_until
from testbed.consul import consul_request

JOB = {"SLURM_JOB_ID": "4242", "SLURMD_NODENAME": "gpu-07"}


def test_outside_slurm_there_is_no_allocation():
    assert slurm.allocation({}) is None


@pytest.mark.parametrize("extra,gpus", [
    ({}, None),
    ({"SLURM_GPUS_ON_NODE": "4"}, 4),
    ({"SLURM_JOB_GPUS": "0,1,3"}, 3),
    ({"SLURM_GPUS_ON_NODE": "2", "SLURM_JOB_GPUS": "0,1,2,3"}, 2),  # the per-node count wins
])
def test_gpus_and_service_id_come_from_the_allocation(extra, gpus):
    job = slurm.allocation({**JOB, **extra})
    assert (job.job_id, job.node_name, job.gpus) == ("4242", "gpu-07", gpus)
    assert job.service_id("horovod") == "horovod-slurm-4242"


@pytest.mark.parametrize("variables,needle", [
    ({"SLURM_JOB_ID": "12a", "SLURMD_NODENAME": "n1"}, "SLURM_JOB_ID='12a'"),
    ({"SLURM_JOB_ID": "12"}, "SLURMD_NODENAME=''"),
    ({"SLURM_JOB_ID": "12", "SLURMD_NODENAME": "n1;rm -rf"}, "SLURMD_NODENAME='n1;rm -rf'"),
    ({**JOB, "SLURM_GPUS_ON_NODE": "two"}, "SLURM_GPUS_ON_NODE='two' is not a GPU count"),
    ({**JOB, "SLURM_JOB_GPUS": "0,,1"}, "SLURM_JOB_GPUS='0,,1' is not a list of GPU indices"),
])
def test_malformed_variables_are_errors_naming_the_variable(variables, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        slurm.allocation(variables)


@pytest.mark.parametrize("line,state,reason", [
    ("NodeName=n1 Arch=x86_64 CoresPerSocket=1 State=IDLE ThreadsPerCore=1", "IDLE", ""),
    ("NodeName=n1 State=MIXED+DRAIN ThreadsPerCore=1 Reason=preempt soon [root@2026-12-02T10:00:00] Comment=(null)",
     "MIXED+DRAIN", "preempt soon [root@2026-12-02T10:00:00]"),
])
def test_node_state_is_parsed_from_scontrol_one_liners(line, state, reason):
    assert slurm.parse_node_state(line) == (state, reason)


def _scontrol(tmp_path, monkeypatch, script: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / "scontrol"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


@pytest.mark.parametrize("script,status,needle", [
    ('echo "NodeName=$4 State=ALLOCATED CPUs=2"\n', PASSING, "Slurm node gpu-07 is ALLOCATED"),
    ('echo "NodeName=$4 State=ALLOCATED+DRAIN Reason=bad gpu Comment=x"\n', CRITICAL, "is ALLOCATED+DRAIN (bad gpu)"),
    ('echo "NodeName=$4 State=DOWN*+NOT_RESPONDING"\n', CRITICAL, "is DOWN*"),
    ('echo "slurm_load_node error: Unable to contact slurm controller" >&2; exit 1\n', WARNING, "Unable to contact"),
    ('echo "garbage"\n', WARNING, "no State="),
])
def test_the_slurm_probe_is_critical_only_when_slurm_takes_the_node(tmp_path, monkeypatch, script, status, needle):
    _scontrol(tmp_path, monkeypatch, script)
    result = slurm.SlurmNodeProbe(ProbeSettings(slurm_node="gpu-07")).check()
    assert result.status == status and needle in result.output, result


def test_the_slurm_probe_needs_a_node_name():
    with pytest.raises(ValueError, match="SLURMD_NODENAME"):
        slurm.SlurmNodeProbe(ProbeSettings())


@pytest.mark.slow
def test_node_agent_in_an_allocation_registers_its_job_and_gpus(cluster, node_agents, tmp_path):
    addr = cluster.addr("localhost")
    env = child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR=addr, SLURM_GPUS_ON_NODE="3", **JOB)
    agent = node_agents.start(addr, "--ttl", "3", env=env)
    wait_until("the job's registration",
               lambda: "horovod-slurm-4242" in consul_request(addr, "GET", "/v1/agent/services")[1], 30)
    meta = consul_request(addr, "GET", "/v1/agent/services")[1]["horovod-slurm-4242"]["Meta"]
    assert (meta["slots"], meta["slurm_job_id"], meta["slurm_node"]) == ("3", "4242", "gpu-07")
    assert agent.stop() == 0


def test_node_agent_refuses_a_malformed_allocation(tmp_path):
    env = child_env(discovery_state=tmp_path, SLURM_JOB_ID="4242", SLURMD_NODENAME="n1", SLURM_JOB_GPUS="all")
    result = subprocess.run([str(HVD_ELASTIC), "node-agent"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == ("hvd-elastic node-agent: error: SLURM_JOB_GPUS='all' is not a list of GPU indices "
                                     "(expected e.g. 0,1,3)")
