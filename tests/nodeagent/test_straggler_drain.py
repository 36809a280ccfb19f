"""The node agent's half of a straggler drain, as a process against both Consul kinds: a job's request
drains the node with a reason naming its figures, the drain is lifted after the cool-down (twice as long
the second time), a drain by hand is never lifted, and a key that is no request is deleted."""

from __future__ import annotations

import time

import pytest

from hvd_elastic.health import stragglers
from testbed import child_env, wait_until
from testbed.consul import consul_request, run_discovery
from tests.nodeagent.test_nodeagent import WAIT, hvd, service_check

pytestmark = pytest.mark.slow

MAINTENANCE = "_service_maintenance:horovod"
REQUEST = stragglers.Request(host="localhost", ratio=3.1, host_s=0.31, job_median_s=0.1, windows=3, window=20)


def ask(addr: str, value: object) -> str:
    """Write a request for the instance ``horovod`` of ``addr``'s node; the key."""
    _, self_ = consul_request(addr, "GET", "/v1/agent/self")
    key = stragglers.request_key("horovod", self_["Config"]["NodeName"], "horovod")
    assert consul_request(addr, "PUT", f"/v1/kv/{key}", value)[0] == 200
    return key


def drain_reason(addr: str) -> str | None:
    check = service_check(addr, MAINTENANCE)
    return None if check is None else check["Notes"]


def test_requested_drains_are_carried_out_and_lifted_and_a_drain_by_hand_stays(cluster, node_agents, tmp_path):
    addr = cluster.addr("localhost")
    env = child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR=addr)
    agent = node_agents.start(addr, "--slots", "2", "--ttl", "3", "--straggler-cooldown", "3s")
    wait_until("discovery to list the node", lambda: run_discovery(env).stdout == "localhost:2\n", WAIT)

    key = ask(addr, REQUEST.fields())
    reason = wait_until("the drain", lambda: drain_reason(addr), WAIT)
    drain = stragglers.parse_reason(reason)
    assert drain is not None and drain.count == 1, reason
    assert reason.endswith(": " + REQUEST.figures())
    assert 1 <= drain.until - time.time() <= 4
    assert run_discovery(env).stdout == ""
    assert consul_request(addr, "GET", f"/v1/kv/{key}")[0] == 404  # carried out: the request is gone
    wait_until("the readmission", lambda: run_discovery(env).stdout == "localhost:2\n", WAIT)
    assert drain_reason(addr) is None and "readmitted service id 'horovod'" in agent.read_log()

    ask(addr, REQUEST.fields())
    second = stragglers.parse_reason(wait_until("the second drain", lambda: drain_reason(addr), WAIT))
    assert second is not None and second.count == 2 and 4 <= second.until - time.time() <= 7  # 6 s: doubled
    by_hand = hvd(env, "drain", "--reason", "bad DIMM")
    assert by_hand.returncode == 0, by_hand.stderr
    assert drain_reason(addr) == "bad DIMM"  # the operator's reason replaced ours
    time.sleep(max(0.0, second.until - time.time()) + 3)  # past the cool-down and a tick
    assert drain_reason(addr) == "bad DIMM" and run_discovery(env).stdout == ""
    assert "drained again by hand" in agent.read_log()

    ask(addr, REQUEST.fields())  # asked while drained by hand: dropped, the operator's drain stands
    wait_until("the request dropped", lambda: consul_request(addr, "GET", f"/v1/kv/{key}")[0] == 404, WAIT)
    assert drain_reason(addr) == "bad DIMM" and "in maintenance already (bad DIMM)" in agent.read_log()

    ask(addr, {"not": "a request"})
    wait_until("the stray key deleted", lambda: consul_request(addr, "GET", f"/v1/kv/{key}")[0] == 404, WAIT)
    assert "is not a job's request" in agent.read_log()
    assert hvd(env, "undrain").returncode == 0
    wait_until("the node back", lambda: run_discovery(env).stdout == "localhost:2\n", WAIT)


def test_a_drain_outlives_a_restarted_agent(cluster, node_agents, tmp_path):
    addr = cluster.addr("localhost")
    env = child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR=addr)
    first = node_agents.start(addr, "--ttl", "3", "--straggler-cooldown", "4s")
    wait_until("discovery to list the node", lambda: run_discovery(env).stdout == "localhost:1\n", WAIT)
    ask(addr, REQUEST.fields())
    wait_until("the drain", lambda: drain_reason(addr), WAIT)
    first.kill()  # no deregistration: the service and its maintenance stay with Consul
    second = node_agents.start(addr, "--ttl", "3", "--straggler-cooldown", "4s")
    wait_until("the readmission by the new agent", lambda: run_discovery(env).stdout == "localhost:1\n", WAIT)
    assert "readmitted service id 'horovod' after its cool-down (drain #1)" in second.read_log()


@pytest.mark.parametrize("args,needle", [
    (["--straggler-cooldown", "-5s"], "--straggler-cooldown"),
    (["--straggler-cooldown", "2h"], "is longer than --straggler-cooldown-max 3600s"),
    (["--straggler-drains", "maybe"], "--straggler-drains"),
])
def test_bad_straggler_settings_exit_2(tmp_path, args, needle):
    result = hvd(child_env(discovery_state=tmp_path), "node-agent", *args)
    assert result.returncode == 2 and needle in result.stderr and len(result.stderr.splitlines()) == 1, result
