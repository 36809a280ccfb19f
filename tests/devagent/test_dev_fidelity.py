"""Answers shaped as real Consul's: agent-local checks, ?filter= everywhere, tagged addresses,
session errors, /v1/agent/self Stats."""

from __future__ import annotations

import urllib.parse

import pytest


def _register(raw, service_id, name="fid", **extra):
    body = {"Name": name, "ID": service_id, "Check": {"TTL": "300s", "Status": "passing"}, **extra}
    status, _, data = raw.request("PUT", "/v1/agent/service/register", body)
    assert status == 200, data


def q(expr: str) -> str:
    return urllib.parse.urlencode({"filter": expr})


def test_agent_checks_lists_only_the_agents_own_checks(raw):
    _register(raw, "fid-own")
    assert raw.request("PUT", "/v1/agent/service/maintenance/fid-own?enable=true")[0] == 200
    assert raw.request("PUT", "/v1/agent/maintenance?enable=true")[0] == 200
    try:
        checks, _ = raw.json("GET", "/v1/agent/checks")
        assert "serfHealth" not in checks  # the catalog's gossip check, no agent check
        assert {"service:fid-own", "_service_maintenance:fid-own", "_node_maintenance"} <= set(checks)
        node_checks, _ = raw.json("GET", "/v1/health/node/gpu-a")
        assert "serfHealth" in {c["CheckID"] for c in node_checks}  # still in the catalog
    finally:
        raw.request("PUT", "/v1/agent/maintenance?enable=false")
        raw.request("PUT", "/v1/agent/service/deregister/fid-own")


@pytest.mark.parametrize("path, expr, key", [
    ("/v1/health/node/gpu-a", 'CheckID == "serfHealth"', "CheckID"),
    ("/v1/health/checks/fid", 'ServiceID == "fid-1"', "ServiceID"),
    ("/v1/health/state/passing", 'ServiceID == "fid-1"', "ServiceID"),
    ("/v1/catalog/nodes", 'Node == "gpu-b"', "Node"),
    ("/v1/catalog/service/fid", 'ServiceID == "fid-1"', "ServiceID"),
])
def test_filter_on_every_listing(raw, path, expr, key):
    _register(raw, "fid-1")
    _register(raw, "fid-2")
    everything, _ = raw.json("GET", path)
    rows, _ = raw.json("GET", f"{path}?{q(expr)}")
    assert len(rows) == 1 < len(everything), (everything, rows)
    assert rows[0][key] in ("serfHealth", "fid-1", "gpu-b")


def test_filter_on_agent_maps(raw):
    _register(raw, "fid-1")
    _register(raw, "fid-2")
    services, _ = raw.json("GET", "/v1/agent/services?" + q('ID == "fid-2"'))
    assert list(services) == ["fid-2"]
    checks, _ = raw.json("GET", "/v1/agent/checks?" + q('ServiceID == "fid-2"'))
    assert list(checks) == ["service:fid-2"]


def test_filter_on_catalog_services_selects_by_instance(raw):
    _register(raw, "fid-cs-1", name="fid-cs", Tags=["gpu"], Meta={"slots": "8"})
    _register(raw, "fid-cs-2", name="fid-cs-other", Tags=["cpu"])
    names, _ = raw.json("GET", "/v1/catalog/services?" + q('ServiceMeta.slots == "8"'))
    assert names == {"fid-cs": ["gpu"]}


@pytest.mark.parametrize("path", ["/v1/catalog/services", "/v1/health/node/gpu-a", "/v1/health/checks/fid",
                                  "/v1/health/state/any", "/v1/catalog/nodes", "/v1/catalog/service/fid",
                                  "/v1/agent/services", "/v1/agent/checks"])
def test_a_bad_filter_is_400_at_once_even_on_a_blocking_query(raw, path):
    # index=far ahead and a long wait: a handler that validated late would hang here until the wait ends.
    status, _, body = raw.request("GET", f"{path}?index=999999999&wait=5m&{q('Nope == 1')}", timeout=20)
    assert status == 400 and b"Nope" in body, body
    status, _, body = raw.request("GET", f"{path}?{q('CheckID ==')}")
    assert status == 400 and body.startswith(b"Failed to create boolean expression evaluator"), body


def test_service_tagged_addresses_use_consuls_casing(raw):
    _register(raw, "fid-tagged", Address="10.1.2.3", Port=80,
              TaggedAddresses={"lan": {"address": "10.1.2.3", "port": 8080}, "wan": {"Address": "1.2.3.4"}})
    svc, _ = raw.json("GET", "/v1/agent/service/fid-tagged")
    assert svc["TaggedAddresses"] == {
        "lan": {"Address": "10.1.2.3", "Port": 8080},
        "wan": {"Address": "1.2.3.4", "Port": 0},
        "lan_ipv4": {"Address": "10.1.2.3", "Port": 80},
        "wan_ipv4": {"Address": "10.1.2.3", "Port": 80},
    }
    (row,), _ = raw.json("GET", "/v1/health/service/fid?" + q('Service.ID == "fid-tagged"'))
    assert row["Service"]["TaggedAddresses"]["lan"] == {"Address": "10.1.2.3", "Port": 8080}
    assert set(row["Node"]["TaggedAddresses"]) == {"lan", "lan_ipv4", "wan", "wan_ipv4"}
    assert all(isinstance(v, str) for v in row["Node"]["TaggedAddresses"].values())


@pytest.mark.parametrize("tagged, message", [
    ({"lan": "10.0.0.1"}, b"json: cannot unmarshal string into Go struct field ServiceDefinition.TaggedAddresses"),
    ({"lan": {"Address": "x", "Port": "80"}}, b"Go struct field ServiceAddress.Port of type int"),
    ({"lan": {"Host": "x"}}, b'json: unknown field "Host"'),
])
def test_bad_service_tagged_addresses_are_400(raw, tagged, message):
    status, _, body = raw.request("PUT", "/v1/agent/service/register", {"Name": "fid-bad", "TaggedAddresses": tagged})
    assert status == 400 and message in body, body


def test_session_on_unknown_node_or_datacenter_is_consuls_500(raw):
    status, _, body = raw.request("PUT", "/v1/session/create", {"Node": "no-such-node"})
    assert (status, body) == (500, b"Missing node registration")
    status, _, body = raw.request("PUT", "/v1/session/create?dc=other", {})
    assert (status, body) == (500, b"No path to datacenter")
    status, _, body = raw.request("PUT", "/v1/session/create?dc=dc1", {})
    assert status == 200, body


def test_agent_self_stats_as_consul_prints_them(raw):
    _register(raw, "fid-stats")
    me, _ = raw.json("GET", "/v1/agent/self")
    stats = me["Stats"]
    consul = stats["consul"]
    assert (consul["leader"], consul["server"], consul["known_datacenters"], consul["acl"]) == (
        "true", "true", "1", "disabled")
    assert consul["leader_addr"] == "127.0.0.1:8300"
    assert int(stats["agent"]["services"]) >= 1 and int(stats["agent"]["check_ttls"]) >= 1
    assert stats["raft"]["state"] == "Leader" and int(stats["raft"]["applied_index"]) > 1
    assert stats["build"]["version"] == me["Config"]["Version"]
    for section in stats.values():
        assert all(isinstance(v, str) for v in section.values()), section
