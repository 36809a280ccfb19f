"""A restricted token (partial read rights): rows it may not read are dropped and the answer says so."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from devagent_helpers import Raw

from hvd_elastic.devagent import DevCluster

ADMIN = "admin-0f4c-partial-test"
READER = "reader-77ab-partial-test"
FILTERED = "x-consul-results-filtered-by-acls"


@pytest.fixture(scope="module")
def partial():
    """Nodes gpu-a and cpu-b; the reader may read nodes gpu-* and services web*, nothing else."""
    with DevCluster(nodes=["gpu-a", "cpu-b"], acl_token=ADMIN, restricted_token=READER,
                    restricted_node_prefixes=["gpu-"], restricted_service_prefixes=["web"]) as c:
        for node in ("gpu-a", "cpu-b"):
            raw = Raw(c.addr(node))
            for name in ("web", "db"):
                body = {"Name": name, "ID": f"{name}-{node}", "Check": {"TTL": "300s", "Status": "passing"}}
                assert raw.request("PUT", "/v1/agent/service/register", body, {"X-Consul-Token": ADMIN})[0] == 200
        yield c


def get(cluster, path, token, node="gpu-a"):
    status, headers, body = Raw(cluster.addr(node)).request("GET", path, headers={"X-Consul-Token": token})
    return status, headers, json.loads(body) if status == 200 else body.decode()


def test_the_reader_sees_only_what_its_rules_allow_and_is_told(partial):
    status, headers, rows = get(partial, "/v1/health/service/web", READER)
    assert status == 200 and [r["Node"]["Node"] for r in rows] == ["gpu-a"]  # cpu-b's instance dropped
    assert headers[FILTERED] == "true"
    _, headers, rows = get(partial, "/v1/catalog/service/web", READER)
    assert [r["Node"] for r in rows] == ["gpu-a"] and headers[FILTERED] == "true"
    _, headers, names = get(partial, "/v1/catalog/services", READER)
    assert sorted(names) == ["web"] and headers[FILTERED] == "true"
    _, headers, nodes = get(partial, "/v1/catalog/nodes", READER)
    assert [n["Node"] for n in nodes] == ["gpu-a"] and headers[FILTERED] == "true"
    _, headers, services = get(partial, "/v1/agent/services", READER)
    assert sorted(services) == ["web-gpu-a"] and headers[FILTERED] == "true"
    _, headers, checks = get(partial, "/v1/agent/checks", READER)
    assert sorted(checks) == ["service:web-gpu-a"] and headers[FILTERED] == "true"
    _, headers, checks = get(partial, "/v1/health/state/any", READER)
    assert {(c["Node"], c["CheckID"]) for c in checks} == {("gpu-a", "serfHealth"), ("gpu-a", "service:web-gpu-a")}


def test_the_header_only_when_something_was_dropped(partial):
    # Everything the answer could hold is readable: no header, as in Consul.
    status, headers, rows = get(partial, "/v1/health/service/web?filter=" + "Node.Node%20%3D%3D%20gpu-a", READER)
    assert status == 200 and len(rows) == 1 and FILTERED not in headers
    status, headers, rows = get(partial, "/v1/health/node/gpu-a?filter=ServiceName%20%3D%3D%20web", READER)
    assert status == 200 and len(rows) == 1 and FILTERED not in headers
    _, headers, rows = get(partial, "/v1/health/service/web", ADMIN)  # the management token sees all
    assert len(rows) == 2 and FILTERED not in headers


def test_a_wholly_hidden_answer_is_empty_with_the_header(partial):
    status, headers, rows = get(partial, "/v1/health/service/db", READER)
    assert (status, rows, headers[FILTERED]) == (200, [], "true")
    status, headers, rows = get(partial, "/v1/health/node/cpu-b", READER)
    assert (status, rows, headers[FILTERED]) == (200, [], "true")


def test_the_reader_may_not_write_or_read_beyond_its_rules(partial):
    raw = Raw(partial.addr("gpu-a"))
    token = {"X-Consul-Token": READER}
    status, _, body = raw.request("PUT", "/v1/agent/service/register", {"Name": "web"}, token)
    assert status == 403 and b"lacks permission 'service:write'" in body
    for method, path, permission in [("GET", "/v1/kv/x", b"key:read"), ("GET", "/v1/agent/self", b"agent:read"),
                                     ("PUT", "/v1/session/create", b"session:write")]:
        status, _, body = raw.request(method, path, headers=token)
        assert status == 403 and body.startswith(b"Permission denied: token with AccessorID '"), (path, body)
        assert permission in body, (path, body)
    status, _, body = raw.request("GET", "/v1/agent/service/db-gpu-a", headers=token)
    assert status == 403 and b"lacks permission 'service:read' on \"db\"" in body
    assert raw.request("GET", "/v1/agent/service/web-gpu-a", headers=token)[0] == 200


def test_constructor_rejects_inconsistent_settings():
    with pytest.raises(ValueError, match="restricted_token needs acl_token"):
        DevCluster(restricted_token="r")
    with pytest.raises(ValueError, match="need restricted_token"):
        DevCluster(acl_token="a", restricted_service_prefixes=["web"])
    with pytest.raises(ValueError, match="must differ"):
        DevCluster(acl_token="a", restricted_token="a")


def test_consul_dev_flags_define_the_restricted_token(tmp_path):
    admin, reader = tmp_path / "admin", tmp_path / "reader"
    admin.write_text(ADMIN)
    reader.write_text(READER)
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen([sys.executable, "-m", "hvd_elastic.cli", "consul-dev", "--http-port", "0",
                             "--nodes", "gpu-a,cpu-b",
                             "--acl-token-file", str(admin), "--acl-restricted-token-file", str(reader),
                             "--acl-restricted-node-prefix", "gpu-", "--acl-restricted-service-prefix", "",
                             "--ready-file", str(ready)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.poll() is not None else "no address line"
        addresses = json.loads(line)
        status, headers, body = Raw(addresses["gpu-a"]).request("GET", "/v1/catalog/nodes",
                                                                 headers={"X-Consul-Token": READER})
        assert status == 200 and [n["Node"] for n in json.loads(body)] == ["gpu-a"]
        assert headers[FILTERED] == "true"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_unknown_and_missing_tokens_are_unchanged_by_the_second_token(partial):
    status, _, body = get(partial, "/v1/health/service/web", READER + "x")
    assert (status, body) == (403, "ACL not found")
    status, headers, rows = get(partial, "/v1/health/service/web", "")  # anonymous: empty, as before
    assert (status, rows) == (200, []) and FILTERED not in headers
