"""hvd_elastic.torchrun.gate: a node's own health from its Consul agent, judged as discovery judges it."""

from __future__ import annotations

from hvd_elastic.consul.config import ConsulConfig
from hvd_elastic.local import ports
from hvd_elastic.torchrun.gate import HealthGate

SERVICES = {"horovod": {"Service": "horovod"}, "other": {"Service": "web"}}


def check(check_id: str, status: str = "passing", service_id: str = "horovod", notes: str = "") -> dict:
    return {"CheckID": check_id, "Status": status, "ServiceID": service_id, "Notes": notes, "Output": ""}


def gate(required: bool = False) -> HealthGate:
    return HealthGate(ConsulConfig.from_env({}), "horovod", required=required)


def test_passing_instances_are_admitted_and_anything_else_names_why():
    judge = gate().judge
    assert judge(SERVICES, {"c": check("service:horovod")}).admitted
    drained = judge(SERVICES, {"c": check("service:horovod"),
                               "m": check("_service_maintenance:horovod", "critical", notes="disk swap")})
    assert not drained.admitted and drained.why == "horovod instance horovod is maintenance: disk swap"
    node_drained = judge(SERVICES, {"c": check("service:horovod"), "n": check("_node_maintenance", "critical", "")})
    assert not node_drained.admitted and "maintenance" in node_drained.why
    sick = judge(SERVICES, {"c": check("service:horovod", "critical")})
    assert not sick.admitted and sick.why.startswith("horovod instance horovod is critical")
    others_sick = judge(SERVICES, {"c": check("service:horovod"), "w": check("service:other", "critical", "other")})
    assert others_sick.admitted  # another service's check is not ours


def test_a_node_without_an_instance_is_admitted_unless_the_gate_is_required():
    assert gate().judge({}, {}).admitted
    kept = gate(required=True).judge({}, {})
    assert not kept.admitted and "no instance of service 'horovod' is registered" in kept.why


def test_an_unreachable_agent_keeps_the_last_answer():
    port, = ports.reserve(1)
    unreachable = HealthGate(ConsulConfig.from_env({}, addr=f"127.0.0.1:{port}"), "horovod", required=True,
                             interval=0.0)
    first = unreachable.read()
    assert first.admitted and "no answer from the local Consul agent yet" in first.why
    unreachable._last = unreachable.judge({}, {})  # an answer once had: kept out
    assert not unreachable.read().admitted
