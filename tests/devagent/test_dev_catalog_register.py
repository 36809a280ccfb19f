"""/v1/catalog/register and /deregister: external nodes (no agent, no serfHealth) in every read path."""

from __future__ import annotations

import json
import threading

import pytest
from devagent_helpers import Raw

from hvd_elastic.devagent import DevCluster

NODE_ID = "2c4a1c6e-8c1b-4a8e-9b3a-0d1f2e3a4b5c"


def ext(node="ext-1", service="ext-svc", status="passing", **extra):
    body = {
        "Node": node, "Address": "10.9.8.7", "ID": NODE_ID,
        "TaggedAddresses": {"lan": "10.9.8.7", "wan": "198.51.100.7"}, "NodeMeta": {"rack": "r1"},
        "Service": {"ID": f"{service}-1", "Service": service, "Tags": ["t1"], "Port": 7000,
                    "Meta": {"slots": "4"}, "TaggedAddresses": {"lan": {"address": "10.9.8.7", "port": 7001}}},
        "Check": {"CheckID": f"{service}-alive", "Name": "alive", "Status": status, "ServiceID": f"{service}-1",
                  "Output": "external monitor says ok"},
    }
    body.update(extra)
    return body


def put(raw, path, body, token=None):
    status, _, data = raw.request("PUT", path, body, {"X-Consul-Token": token} if token else None)
    return status, data.decode()


def test_an_external_node_shows_everywhere_without_serf_health(raw):
    assert put(raw, "/v1/catalog/register", ext()) == (200, "true")
    nodes, _ = raw.json("GET", "/v1/catalog/nodes")
    node = next(n for n in nodes if n["Node"] == "ext-1")
    assert (node["ID"], node["Address"], node["Meta"]) == (NODE_ID, "10.9.8.7", {"rack": "r1"})
    assert node["TaggedAddresses"] == {"lan": "10.9.8.7", "wan": "198.51.100.7"}
    (row,), _ = raw.json("GET", "/v1/health/service/ext-svc?passing")
    assert [c["CheckID"] for c in row["Checks"]] == ["ext-svc-alive"]  # no serfHealth: no agent gossips for it
    assert row["Checks"][0]["Output"] == "external monitor says ok"
    assert row["Service"]["TaggedAddresses"] == {"lan": {"Address": "10.9.8.7", "Port": 7001}}
    (entry,), _ = raw.json("GET", "/v1/catalog/service/ext-svc")
    assert (entry["Node"], entry["ServicePort"], entry["ServiceMeta"]) == ("ext-1", 7000, {"slots": "4"})
    checks, _ = raw.json("GET", "/v1/health/node/ext-1")
    assert [c["CheckID"] for c in checks] == ["ext-svc-alive"]
    assert "ext-svc" in raw.json("GET", "/v1/catalog/services")[0]
    assert raw.json("GET", "/v1/health/service/ext-svc?node-meta=rack:r1")[0]
    assert raw.json("GET", "/v1/health/service/ext-svc?node-meta=rack:r2")[0] == []
    assert "ext-svc-1" not in raw.json("GET", "/v1/agent/services")[0]  # not any agent's service


def test_status_comes_from_the_registration_and_passing_follows(raw):
    assert put(raw, "/v1/catalog/register", ext("ext-2", "ext-st"))[0] == 200
    assert len(raw.json("GET", "/v1/health/service/ext-st?passing")[0]) == 1
    assert put(raw, "/v1/catalog/register", ext("ext-2", "ext-st", status="critical"))[0] == 200
    assert raw.json("GET", "/v1/health/service/ext-st?passing")[0] == []
    body = ext("ext-2", "ext-st")
    del body["Check"]["Status"]  # Consul stores a check given without status as critical
    body["Check"]["CheckID"] = "ext-st-second"
    assert put(raw, "/v1/catalog/register", body)[0] == 200
    (row,), _ = raw.json("GET", "/v1/health/service/ext-st")
    assert ({c["CheckID"]: c["Status"] for c in row["Checks"]}
            == {"ext-st-alive": "critical", "ext-st-second": "critical"})


def test_a_blocking_query_wakes_on_a_catalog_registration(raw):
    _, headers = raw.json("GET", "/v1/health/service/ext-wake")
    index = int(headers["x-consul-index"])
    answer = {}

    def block():
        status, hdrs, data = raw.request("GET", f"/v1/health/service/ext-wake?index={index}&wait=60s", timeout=90)
        answer.update(status=status, index=int(hdrs["x-consul-index"]), rows=json.loads(data))

    waiter = threading.Thread(target=block)
    waiter.start()
    assert put(raw, "/v1/catalog/register", ext("ext-3", "ext-wake"))[0] == 200
    waiter.join(timeout=30)  # returns at the write, not after the 60 s wait
    assert not waiter.is_alive()
    assert answer["status"] == 200 and answer["index"] > index
    assert [r["Node"]["Node"] for r in answer["rows"]] == ["ext-3"]


def test_skip_node_update_keeps_the_node_as_it_is(raw):
    assert put(raw, "/v1/catalog/register", ext("ext-4", "ext-skip"))[0] == 200
    body = {"Node": "ext-4", "SkipNodeUpdate": True, "Service": {"Service": "ext-skip-2", "Port": 1}}
    assert put(raw, "/v1/catalog/register", body) == (200, "true")
    (entry,), _ = raw.json("GET", "/v1/catalog/service/ext-skip-2")
    assert (entry["Address"], entry["ServiceID"]) == ("10.9.8.7", "ext-skip-2")  # ID defaults to the name


def test_deregister_service_check_then_node(raw):
    assert put(raw, "/v1/catalog/register", ext("ext-5", "ext-dereg"))[0] == 200
    assert put(raw, "/v1/catalog/deregister", {"Node": "ext-5", "CheckID": "ext-dereg-alive"}) == (200, "true")
    (row,), _ = raw.json("GET", "/v1/health/service/ext-dereg")
    assert row["Checks"] == []
    assert put(raw, "/v1/catalog/deregister", {"Node": "ext-5", "ServiceID": "ext-dereg-1"}) == (200, "true")
    assert raw.json("GET", "/v1/health/service/ext-dereg")[0] == []
    assert put(raw, "/v1/catalog/deregister", {"Node": "ext-5"}) == (200, "true")
    assert "ext-5" not in {n["Node"] for n in raw.json("GET", "/v1/catalog/nodes")[0]}
    assert put(raw, "/v1/catalog/deregister", {"Node": "ext-5"}) == (200, "true")  # unknown: no error


def test_deregistering_a_node_destroys_its_sessions_and_frees_their_locks(raw):
    assert put(raw, "/v1/catalog/register", {"Node": "ext-6", "Address": "10.0.0.6"})[0] == 200
    session, _ = raw.json("PUT", "/v1/session/create", {"Node": "ext-6", "Checks": []})  # no serfHealth to tie to
    assert put(raw, f"/v1/kv/ext-lock?acquire={session['ID']}", "me") == (200, "true")
    assert put(raw, "/v1/catalog/deregister", {"Node": "ext-6"})[0] == 200
    assert raw.json("GET", f"/v1/session/info/{session['ID']}")[0] == []
    (entry,), _ = raw.json("GET", "/v1/kv/ext-lock")
    assert "Session" not in entry


@pytest.mark.parametrize("change, status, message", [
    ({"Node": ""}, 400, "Must provide node"),
    ({"Address": ""}, 400, "Must provide address if SkipNodeUpdate is not set"),
    ({"ID": "nope"}, 400, "Bad node ID: uuid string is wrong length: 'nope'"),
    ({"Service": {"ID": "x"}}, 400, "Must provide service name (Service.Service) when service ID is provided"),
    ({"Service": {"Service": "x", "Address": "0.0.0.0"}}, 400, "Invalid service address"),
    ({"Check": {"CheckID": "c", "Node": "other"}}, 400,
     "Node 'other' for check 'c' doesn't match register request node 'ext-bad'"),
    ({"Check": {"CheckID": "c", "ServiceID": "nope"}}, 400, "Unknown service ID 'nope' for check ID 'c'"),
    ({"Check": {"CheckID": "c", "Status": "fine"}}, 400, "Bad check status 'fine'"),
    ({"Check": {"Status": "passing"}}, 400, "Missing check ID"),
    ({"Datacenter": "dc9"}, 500, "No path to datacenter"),
    ({"Node": "gpu-a"}, 400, "node 'gpu-a' runs a dev agent"),
    ({"Nodee": "x"}, 400, 'Request decode failed: json: unknown field "Nodee"'),
    ({"Service": {"Service": "x", "Port": "80"}}, 400, "Go struct field NodeService.Port of type int"),
])
def test_bad_registrations_change_nothing(raw, change, status, message):
    body = ext("ext-bad", "ext-bad")
    body.update(change)
    got_status, text = put(raw, "/v1/catalog/register", body)
    assert got_status == status and message in text, (got_status, text)
    assert "ext-bad" not in {n["Node"] for n in raw.json("GET", "/v1/catalog/nodes")[0]}


def test_bad_deregistrations(raw):
    assert put(raw, "/v1/catalog/deregister", {}) == (400, "Must provide node")
    status, text = put(raw, "/v1/catalog/deregister", {"Node": "gpu-b"})
    assert status == 400 and "runs a dev agent" in text
    assert put(raw, "/v1/catalog/deregister?dc=dc9", {"Node": "x"}) == (500, "No path to datacenter")
    assert put(raw, "/v1/catalog/deregister", {"Node": "gpu-b"})[0] == 400
    assert "gpu-b" in {n["Node"] for n in raw.json("GET", "/v1/catalog/nodes")[0]}


def test_with_acls_only_the_management_token_writes_the_catalog():
    with DevCluster(nodes=["gpu-a"], acl_token="mgmt", restricted_token="reader",
                    restricted_service_prefixes=[""], restricted_node_prefixes=[""]) as cluster:
        raw = Raw(cluster.addr("gpu-a"))
        status, text = put(raw, "/v1/catalog/register", ext())
        assert status == 403 and "anonymous token lacks permission 'node:write'" in text
        status, text = put(raw, "/v1/catalog/register", ext(), token="reader")
        assert status == 403 and "lacks permission 'node:write'" in text
        assert put(raw, "/v1/catalog/register", ext(), token="wrong")[0] == 403
        assert put(raw, "/v1/catalog/register", ext(), token="mgmt") == (200, "true")
        assert put(raw, "/v1/catalog/deregister", {"Node": "ext-1"}, token="reader")[0] == 403
        assert put(raw, "/v1/catalog/deregister", {"Node": "ext-1"}, token="mgmt") == (200, "true")


def test_py_consul_registers_reads_and_deregisters_an_external_node(c):
    # The maintained client, unchanged, as the outside check of shapes and answers.
    check = {"Node": "ext-py", "CheckID": "ext-py-alive", "Name": "alive", "Status": "passing", "ServiceID": "py-svc-1"}
    service = {"ID": "py-svc-1", "Service": "py-svc", "Port": 7100, "Meta": {"slots": "2"}}
    assert c.catalog.register("ext-py", "10.9.8.70", service=service, check=check, node_meta={"rack": "r9"}) is True
    _, rows = c.health.service("py-svc", passing=True)
    assert [(r["Node"]["Node"], r["Service"]["Meta"]) for r in rows] == [("ext-py", {"slots": "2"})]
    _, checks = c.health.node("ext-py")
    assert [ch["CheckID"] for ch in checks] == ["ext-py-alive"]  # an external node has no serfHealth
    _, checks = c.health.node("ext-py", filter_expr='CheckID == "none"')
    assert checks == []
    assert "serfHealth" not in c.agent.checks()
    assert c.catalog.deregister("ext-py", service_id="py-svc-1") is True
    assert c.health.service("py-svc")[1] == []
    assert c.catalog.deregister("ext-py") is True
    assert "ext-py" not in [n["Node"] for n in c.catalog.nodes()[1]]
