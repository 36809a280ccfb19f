"""/v1/agent/*: registration variants, TTL checks, maintenance, errors -- over real HTTP."""

from __future__ import annotations

import time

import consul
import pytest
from devagent_helpers import check_status, wait_until


def test_register_camel_case_with_meta_tags_address_port(c, raw):
    status, headers, body = raw.request("PUT", "/v1/agent/service/register", {
        "Name": "camel", "ID": "camel-1", "Tags": ["gpu", "v1"], "Address": "10.0.0.7", "Port": 2222,
        "Meta": {"slots": "4"}, "Check": {"TTL": "30s", "Status": "passing"},
    })
    assert (status, body) == (200, b"")
    svc = c.agent.services()["camel-1"]
    tagged = {"Address": "10.0.0.7", "Port": 2222}
    assert svc == {"ID": "camel-1", "Service": "camel", "Tags": ["gpu", "v1"], "Meta": {"slots": "4"},
                   "Port": 2222, "Address": "10.0.0.7", "Weights": {"Passing": 1, "Warning": 1},
                   "EnableTagOverride": False, "Datacenter": "dc1",
                   "TaggedAddresses": {"lan_ipv4": tagged, "wan_ipv4": tagged}}
    check = c.agent.checks()["service:camel-1"]
    assert check["Status"] == "passing" and check["Type"] == "ttl"
    assert check["Name"] == "Service 'camel' check" and check["ServiceName"] == "camel"


def test_register_snake_case_keys_and_default_id(c, raw):
    status, _, body = raw.request("PUT", "/v1/agent/service/register", {
        "name": "snake", "tags": ["a"], "enable_tag_override": True, "meta": {"k": "v"},
        "check": {"ttl": "30s", "deregister_critical_service_after": "90s", "check_id": "snake-ttl"},
    })
    assert status == 200, body
    svc = c.agent.services()["snake"]  # ID defaults to Name
    assert svc["EnableTagOverride"] is True and svc["Meta"] == {"k": "v"}
    check = c.agent.checks()["snake-ttl"]
    assert check["Status"] == "critical"  # Consul's default initial status
    assert check["Definition"]["DeregisterCriticalServiceAfter"] == "1m30s"


def test_several_checks_get_numbered_ids(c, raw):
    status, _, _ = raw.request("PUT", "/v1/agent/service/register", {
        "Name": "multi", "Checks": [{"TTL": "30s"}, {"TTL": "30s", "Name": "second"}],
    })
    assert status == 200
    checks = c.agent.checks()
    assert checks["service:multi:1"]["Name"] == "Service 'multi' check"
    assert checks["service:multi:2"]["Name"] == "second"


def test_reregister_keeps_or_replaces_checks(c, raw):
    c.agent.service.register("rep", service_id="rep", check=consul.Check.ttl("30s"))
    raw.request("PUT", "/v1/agent/check/register", {"Name": "extra", "CheckID": "rep-extra", "TTL": "30s",
                                                    "ServiceID": "rep"})
    assert "rep-extra" in c.agent.checks()
    c.agent.service.register("rep", service_id="rep", check=consul.Check.ttl("30s"))
    assert "rep-extra" in c.agent.checks()  # kept without ?replace-existing-checks
    status, _, _ = raw.request("PUT", "/v1/agent/service/register?replace-existing-checks",
                               {"Name": "rep", "Check": {"TTL": "30s"}})
    assert status == 200
    checks = c.agent.checks()
    assert "rep-extra" not in checks and "service:rep" in checks


def test_reregister_keeps_check_status_and_does_not_move_the_index(c):
    c.agent.service.register("keep", service_id="keep", port=5, check=consul.Check.ttl("30s"))
    c.agent.check.ttl_pass("service:keep", notes="fine")
    index, _ = c.health.service("keep")
    c.agent.service.register("keep", service_id="keep", port=5, check=consul.Check.ttl("30s"))
    check = c.agent.checks()["service:keep"]
    assert (check["Status"], check["Output"]) == ("passing", "fine")  # as Consul restores them
    assert c.health.service("keep")[0] == index  # identical registration: nothing written
    c.agent.service.register("keep", service_id="keep", port=6, check=consul.Check.ttl("30s"))
    assert int(c.health.service("keep")[0]) > int(index)


def test_deregister_removes_service_and_checks_unknown_is_ok(c, raw):
    c.agent.service.register("gone", service_id="gone", check=consul.Check.ttl("30s"))
    assert c.agent.service.deregister("gone") is True
    assert "gone" not in c.agent.services() and "service:gone" not in c.agent.checks()
    status, _, body = raw.request("PUT", "/v1/agent/service/deregister/never-registered")
    assert (status, body) == (200, b"")


def test_ttl_pass_warn_fail_update_and_notes(c, raw):
    c.agent.service.register("ttl", service_id="ttl", check=consul.Check.ttl("30s"))
    c.agent.check.ttl_pass("service:ttl", notes="all good")
    check = c.agent.checks()["service:ttl"]
    assert (check["Status"], check["Output"]) == ("passing", "all good")
    c.agent.check.ttl_warn("service:ttl")
    assert check_status(c, "service:ttl") == "warning"
    c.agent.check.ttl_fail("service:ttl", notes="bad")
    assert check_status(c, "service:ttl") == "critical"
    status, _, _ = raw.request("PUT", "/v1/agent/check/update/service:ttl", {"Status": "passing", "Output": "ok"})
    assert status == 200
    assert c.agent.checks()["service:ttl"]["Output"] == "ok"
    status, _, body = raw.request("PUT", "/v1/agent/check/update/service:ttl", {"Status": "sideways"})
    assert (status, body) == (400, b"Invalid check status: 'sideways'")


def test_ttl_update_on_unknown_or_non_ttl_check_is_consul_500(c, raw):
    status, _, body = raw.request("PUT", "/v1/agent/check/pass/no-such-check")
    assert (status, body) == (500, b'CheckID "no-such-check" does not have associated TTL')
    with pytest.raises(consul.ConsulException):
        c.agent.check.ttl_pass("serfHealth")


def test_ttl_expiry_turns_critical_with_ttl_expired(c):
    c.agent.service.register("expiring", service_id="expiring", check=consul.Check.ttl("1s"))
    c.agent.check.ttl_pass("service:expiring", notes="alive")
    started = time.monotonic()
    assert check_status(c, "service:expiring") == "passing"
    wait_until(lambda: check_status(c, "service:expiring") == "critical", timeout=5)
    elapsed = time.monotonic() - started
    assert elapsed >= 0.9, f"expired after {elapsed:.2f}s, before its 1s TTL"
    output = c.agent.checks()["service:expiring"]["Output"]
    assert output == "TTL expired (last output before timeout follows): alive"


def test_service_maintenance_on_off_and_errors(c, raw):
    c.agent.service.register("maint", service_id="maint", check=consul.Check.ttl("30s"))
    c.agent.check.ttl_pass("service:maint")
    assert c.agent.service.maintenance("maint", "true", reason="draining") is True
    check = c.agent.checks()["_service_maintenance:maint"]
    assert (check["Status"], check["Notes"], check["ServiceID"]) == ("critical", "draining", "maint")
    assert c.health.service("maint", passing=True)[1] == []
    c.agent.service.maintenance("maint", "false")
    assert "_service_maintenance:maint" not in c.agent.checks()
    assert len(c.health.service("maint", passing=True)[1]) == 1
    assert raw.request("PUT", "/v1/agent/service/maintenance/maint")[::2] == (400, b"Missing value for enable")
    assert raw.request("PUT", "/v1/agent/service/maintenance/maint?enable=maybe")[::2] == (
        400, b'Invalid value for enable: "maybe"')
    assert raw.request("PUT", "/v1/agent/service/maintenance/nope?enable=true")[::2] == (
        404, b'No service registered with ID "nope"')


def test_node_maintenance_drops_all_node_services_from_passing(c, raw):
    c.agent.service.register("nm", service_id="nm", check=consul.Check.ttl("30s"))
    c.agent.check.ttl_pass("service:nm")
    assert len(c.health.service("nm", passing=True)[1]) == 1
    status, _, _ = raw.request("PUT", "/v1/agent/maintenance?enable=1")
    assert status == 200
    try:
        check = c.agent.checks()["_node_maintenance"]
        assert check["Status"] == "critical" and check["Notes"].startswith("Maintenance mode is enabled for this node")
        assert c.health.service("nm", passing=True)[1] == []
    finally:
        c.agent.maintenance("false")
    assert "_node_maintenance" not in c.agent.checks()
    assert len(c.health.service("nm", passing=True)[1]) == 1


def test_agent_self_and_members(c, cluster):
    self_info = c.agent.self()
    assert self_info["Config"]["NodeName"] == "gpu-a" and self_info["Config"]["Datacenter"] == "dc1"
    assert {m["Name"] for m in c.agent.members()} == {"gpu-a", "gpu-b"}


def test_registration_is_per_agent_but_catalog_is_shared(cluster):
    from devagent_helpers import client

    a, b = client(cluster, "gpu-a"), client(cluster, "gpu-b")
    b.agent.service.register("shared", service_id="shared-b", port=2)
    a.agent.service.register("shared", service_id="shared-a", port=1)
    assert "shared-b" not in a.agent.services() and "shared-b" in b.agent.services()
    nodes = sorted((e["Node"]["Node"], e["Service"]["ID"]) for e in a.health.service("shared")[1])
    assert nodes == [("gpu-a", "shared-a"), ("gpu-b", "shared-b")]


def test_check_register_and_deregister(c, raw):
    assert raw.request("PUT", "/v1/agent/check/register", {"TTL": "30s"})[::2] == (400, b"Missing check name")
    assert raw.request("PUT", "/v1/agent/check/register", {"Name": "x", "TTL": "30s", "ServiceID": "nope"})[::2] == (
        404, b'ServiceID "nope" does not exist')
    status, _, _ = raw.request("PUT", "/v1/agent/check/register", {"Name": "node-level", "TTL": "30s",
                                                                   "Status": "passing"})
    assert status == 200
    check = c.agent.checks()["node-level"]  # CheckID defaults to Name; no service: a node check
    assert (check["Status"], check["ServiceID"]) == ("passing", "")
    assert c.agent.check.deregister("node-level") is True
    assert "node-level" not in c.agent.checks()
