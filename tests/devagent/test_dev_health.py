"""/v1/health and /v1/catalog: ?passing, tags, bexpr filters, node death, blocking queries."""

from __future__ import annotations

import socket
import threading
import time
import urllib.parse

import consul
import pytest
from devagent_helpers import Raw, client, wait_until


def _register(cl, sid, name="web", tags=(), meta=None, status="passing"):
    cl.agent.service.register(name, service_id=sid, tags=list(tags), meta=meta or {}, port=80,
                              check=consul.Check.ttl("60s"))
    if status == "passing":
        cl.agent.check.ttl_pass(f"service:{sid}")


def _ids(entries):
    return sorted(e["Service"]["ID"] for e in entries)


def test_health_service_shape_and_passing(cluster):
    a, b = client(cluster, "gpu-a"), client(cluster, "gpu-b")
    _register(a, "hs-a", name="hs")
    _register(b, "hs-b", name="hs", status="critical")
    _, entries = a.health.service("hs")
    assert _ids(entries) == ["hs-a", "hs-b"]
    entry = next(e for e in entries if e["Service"]["ID"] == "hs-a")
    assert set(entry) == {"Node", "Service", "Checks"}
    assert entry["Node"]["Node"] == "gpu-a" and entry["Node"]["Address"] == "127.0.0.1"
    assert {ch["CheckID"] for ch in entry["Checks"]} == {"serfHealth", "service:hs-a"}
    assert _ids(a.health.service("hs", passing=True)[1]) == ["hs-a"]


def test_node_death_drops_its_services_from_passing(cluster):
    a, b = client(cluster, "gpu-a"), client(cluster, "gpu-b")
    _register(b, "dies-b", name="dies")
    _register(a, "dies-a", name="dies")
    assert _ids(a.health.service("dies", passing=True)[1]) == ["dies-a", "dies-b"]
    cluster.stop_node("gpu-b")
    try:
        assert not cluster.is_running("gpu-b")
        with pytest.raises(Exception):
            b.agent.services()  # its port is closed
        assert _ids(a.health.service("dies", passing=True)[1]) == ["dies-a"]
        serf = next(ch for ch in a.health.node("gpu-b")[1] if ch["CheckID"] == "serfHealth")
        assert (serf["Status"], serf["Output"]) == ("critical", "Agent not live or unreachable")
    finally:
        cluster.start_node("gpu-b")
    assert _ids(a.health.service("dies", passing=True)[1]) == ["dies-a", "dies-b"]


def test_tags_must_all_match_case_insensitively(cluster, raw):
    a = client(cluster)
    _register(a, "tag-1", name="tagged", tags=["gpu", "v1"])
    _register(a, "tag-2", name="tagged", tags=["gpu"])
    entries, _ = raw.json("GET", "/v1/health/service/tagged?tag=GPU&tag=v1")
    assert _ids(entries) == ["tag-1"]
    assert _ids(a.health.service("tagged", tag="gpu")[1]) == ["tag-1", "tag-2"]
    rows = a.catalog.service("tagged", tag="v1")[1]
    assert [r["ServiceID"] for r in rows] == ["tag-1"]


@pytest.mark.parametrize("expr, expected", [
    ('Service.Meta.slots == "4"', ["f-4"]),
    ('Service.Meta.slots != "4"', ["f-8", "f-x"]),
    ('"v2" in Service.Tags', ["f-8"]),
    ('"v2" not in Service.Tags', ["f-4", "f-x"]),
    ("Service.Tags contains v1 and Node.Node == gpu-a", ["f-4"]),
    ('"4" in Service.Meta.slots', ["f-4"]),
    ("Service.Meta.slots is empty", ["f-x"]),
    ("Service.Meta.slots is not empty and not (Service.ID == f-8)", ["f-4"]),
    ("Service.Port == 80 or Service.ID == nothing", ["f-4", "f-8", "f-x"]),
    ('Checks.Status == critical', ["f-x"]),
    ('Checks.CheckID contains "serf"', ["f-4", "f-8", "f-x"]),
    ('Service.Meta["slots"] == `8`', ["f-8"]),
])
def test_filter_expressions(cluster, raw, expr, expected):
    a = client(cluster)
    if "f-4" not in a.agent.services():
        _register(a, "f-4", name="filtered", tags=["v1"], meta={"slots": "4"})
        _register(a, "f-8", name="filtered", tags=["v2"], meta={"slots": "8"})
        _register(a, "f-x", name="filtered", tags=[], status="critical")
    query = urllib.parse.urlencode({"filter": expr})
    entries, _ = raw.json("GET", f"/v1/health/service/filtered?{query}")
    assert _ids(entries) == expected


@pytest.mark.parametrize("expr", ["Service.Meta.slots ==", "(Service.ID == a", "Nope.Field == 1", "== x",
                                  "Service.ID matches \"(\""])
def test_bad_filter_is_400(raw, expr):
    status, _, body = raw.request("GET", "/v1/health/service/web?" + urllib.parse.urlencode({"filter": expr}))
    assert status == 400 and body.startswith(b"Failed to create boolean expression evaluator"), body


def test_health_state_and_catalog_listings(cluster, raw):
    a = client(cluster)
    _register(a, "cat-1", name="cat", tags=["t1"])
    critical = a.health.state("critical")[1]
    assert all(ch["Status"] == "critical" for ch in critical)
    assert any(ch["CheckID"] == "service:cat-1" for ch in a.health.state("any")[1])
    assert raw.request("GET", "/v1/health/state/bogus")[0] == 400
    assert a.catalog.services()[1]["cat"] == ["t1"]
    assert {n["Node"] for n in a.catalog.nodes()[1]} >= {"gpu-a", "gpu-b"}
    row = a.catalog.service("cat")[1][0]
    assert (row["ServiceID"], row["Node"], row["ServicePort"], row["ServiceTags"]) == ("cat-1", "gpu-a", 80, ["t1"])
    assert "Checks" not in row  # the catalog has no health information
    assert a.catalog.datacenters() == ["dc1"]


def test_dc_and_consistency_parameters(raw):
    assert raw.request("GET", "/v1/health/service/web?dc=dc1")[0] == 200
    assert raw.request("GET", "/v1/health/service/web?dc=elsewhere")[::2] == (500, b"No path to datacenter")
    assert raw.request("GET", "/v1/catalog/services?stale&consistent")[0] == 400


def test_blocking_query_returns_on_change(cluster):
    a, b = client(cluster, "gpu-a"), client(cluster, "gpu-b")
    _register(a, "blk-a", name="blk")
    index, entries = a.health.service("blk", passing=True)
    assert _ids(entries) == ["blk-a"]
    result = {}
    parked = cluster.watcher_count()

    def watch():
        # A wait far longer than the join below: an answer at all means a change woke it.
        result["value"] = a.health.service("blk", passing=True, index=index, wait="10m")

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    wait_until(lambda: cluster.watcher_count() > parked)  # the query is parked in the agent
    assert "value" not in result  # and has not answered: nothing changed
    _register(b, "blk-b", name="blk")
    watcher.join(timeout=60)
    assert not watcher.is_alive(), "the registration did not wake the blocking query"
    # The first wake-up may be the registration (critical check) or the pass.
    new_index, entries = result["value"]
    assert int(new_index) > int(index)
    wait_until(lambda: _ids(a.health.service("blk", passing=True)[1]) == ["blk-a", "blk-b"])


def test_blocking_query_times_out_at_wait(cluster, raw):
    a = client(cluster)
    _register(a, "quiet-1", name="quiet")
    index, _ = a.health.service("quiet")
    started = time.monotonic()
    # The client's 30 s timeout is the hang guard: an agent that ignored wait=1s
    # (Consul's default is 5 min) makes this request raise.
    status, headers, _ = raw.request("GET", f"/v1/health/service/quiet?index={index}&wait=1s", timeout=30)
    elapsed = time.monotonic() - started
    assert status == 200 and headers["x-consul-index"] == index
    assert elapsed >= 1.0, elapsed  # it waited: no early answer without a change


def test_unrelated_writes_do_not_wake_a_service_watcher(cluster, raw):
    a = client(cluster)
    _register(a, "iso-1", name="isolated")
    index, _ = a.health.service("isolated")
    done = {}
    parked = cluster.watcher_count()

    def watch():
        done["r"] = raw.request("GET", f"/v1/health/service/isolated?index={index}&wait=2s")
        done["t"] = time.monotonic()

    started = time.monotonic()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    wait_until(lambda: cluster.watcher_count() > parked)  # the writes below come while it is parked
    for i in range(5):
        _register(a, f"other-{i}", name="other-service")
        a.kv.put(f"noise/{i}", "x")
    watcher.join(timeout=60)  # a hang guard only
    # Answered at the end of its wait with the index it waited on: no write above woke it.
    assert done["r"][1]["x-consul-index"] == index
    assert done["t"] - started >= 2.0


def test_blocking_headers_and_bad_wait_index(raw):
    status, headers, _ = raw.request("GET", "/v1/catalog/services")
    assert status == 200 and int(headers["x-consul-index"]) >= 1
    assert headers["x-consul-knownleader"] == "true" and headers["x-consul-lastcontact"] == "0"
    assert headers["content-type"] == "application/json"
    assert raw.request("GET", "/v1/catalog/services?index=1&wait=forever")[::2] == (400, b"Invalid wait time")
    assert raw.request("GET", "/v1/catalog/services?index=-3")[::2] == (400, b"Invalid index")


def test_many_watchers_park_without_threads(cluster):
    a = client(cluster)
    _register(a, "park-1", name="parked")
    index, _ = a.health.service("parked")
    host, port = cluster.addr("gpu-a").rsplit(":", 1)
    raws = [Raw(cluster.addr("gpu-a")) for _ in range(50)]
    results = []
    threads = [threading.Thread(target=lambda r=r: results.append(
        r.request("GET", f"/v1/health/service/parked?index={index}&wait=20s"))) for r in raws]
    for t in threads:
        t.start()
    wait_until(lambda: cluster.watcher_count() >= 50)
    server_threads = [t for t in threading.enumerate() if t.name == "consul-dev"]
    assert len(server_threads) == 1  # 50 parked queries, one event loop thread
    _register(a, "park-2", name="parked")
    for t in threads:
        t.join(timeout=10)
    assert len(results) == 50 and all(r[0] == 200 for r in results)
    assert all(int(r[1]["x-consul-index"]) > int(index) for r in results)


def test_abandoned_blocking_query_is_dropped(cluster):
    a = client(cluster)
    _register(a, "hang-1", name="hangup")
    index, _ = a.health.service("hangup")
    host, port = cluster.addr("gpu-a").rsplit(":", 1)
    baseline = cluster.watcher_count()
    socks = []
    for _ in range(5):
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(f"GET /v1/health/service/hangup?index={index}&wait=5m HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        socks.append(sock)
    wait_until(lambda: cluster.watcher_count() >= baseline + 5)
    for sock in socks:
        sock.close()  # the client gives up, as a time-bounded discovery script does
    wait_until(lambda: cluster.watcher_count() == baseline, timeout=5)


def test_pipelined_request_behind_a_blocking_query(cluster):
    a = client(cluster)
    _register(a, "pipe-1", name="piped")
    index, _ = a.health.service("piped")
    host, port = cluster.addr("gpu-a").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"GET /v1/health/service/piped?index={index}&wait=1s HTTP/1.1\r\nHost: x\r\n\r\n"
                     "GET /v1/status/leader HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        reply = b""
        while reply.count(b"HTTP/1.1 200 OK") < 2 or not reply.endswith(b'"127.0.0.1:8300"'):
            chunk = sock.recv(65536)
            assert chunk, reply
            reply += chunk
