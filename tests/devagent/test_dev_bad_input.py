"""Bad input gets a clear 4xx, the server stays up and no state is corrupted."""

from __future__ import annotations

import http.client
import socket

import pytest
from devagent_helpers import Raw


@pytest.mark.parametrize("body, reason", [
    (b"{not json", b"Request decode failed: "),
    (b"", b"Request decode failed: EOF"),
    (b"[1, 2]", b"Request decode failed: json: cannot unmarshal array into Go value of type structs.ServiceDefinition"),
    (b'{"Name": 5}', b"Request decode failed: json: cannot unmarshal number 5 "
                     b"into Go struct field ServiceDefinition.Name of type string"),
    (b'{"Name": "x", "Port": "80"}', b"Request decode failed: json: cannot unmarshal string "
                                     b"into Go struct field ServiceDefinition.Port of type int"),
    (b'{"Name": "x", "Port": true}', b"of type int"),
    (b'{"Name": "x", "Tags": "gpu"}', b"ServiceDefinition.Tags of type []string"),
    (b'{"Name": "x", "Meta": {"slots": 4}}', b"ServiceDefinition.Meta of type map[string]string"),
    (b'{"Name": "x", "Chekc": {"TTL": "10s"}}', b'Request decode failed: json: unknown field "Chekc"'),
    (b'{"Name": "x", "Check": {"TTL": "ten seconds"}}',
     b"Request decode failed: error decoding 'TTL': time: invalid duration"),
    (b'{"Name": "x", "Check": {"TTL": "10s", "Interval": "10s"}}',
     b"Invalid check: Interval and TTL cannot both be specified"),
    (b'{"Name": "x", "Check": {"HTTP": "http://127.0.0.1:1/"}}', b"Invalid check: Interval must be > 0"),
    (b'{"Name": "x", "Check": {"TTL": "10s", "Status": "fine"}}',
     b"Status for checks must 'passing', 'warning', 'critical'"),
    (b'{"Name": "x", "Check": {"ScriptArgs": ["/bin/true"], "Interval": "10s"}}',
     b"ScriptArgs checks are not supported"),
    (b'{"Name": "x", "Meta": {"consul-x": "1"}}', b"Key prefix 'consul-' is reserved"),
    (b'{"Tags": ["a"]}', b"Missing service name"),
    (b'{"Name": "x", "Address": "0.0.0.0"}', b"Invalid service address"),
    (b'{"Name": "x", "Weights": {"Passing": 0}}', b"Invalid Weights: Passing must be greater than 0"),
])
def test_bad_registration_is_400(raw, body, reason):
    status, headers, data = raw.request("PUT", "/v1/agent/service/register", body)
    assert status == 400, data
    assert data.startswith(reason) or reason in data, data
    assert headers["content-type"].startswith("text/plain")


def test_bad_input_leaves_state_intact(c, raw):
    c.agent.service.register("intact", service_id="intact", port=1)
    before = c.agent.services()["intact"]
    raw.request("PUT", "/v1/agent/service/register", b'{"Name": "intact", "ID": "intact", "Port": "oops"}')
    assert c.agent.services()["intact"] == before


def test_oversize_body_is_413_and_server_survives(cluster, raw):
    host, port = cluster.addr("gpu-a").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.putrequest("PUT", "/v1/agent/service/register")
    conn.putheader("Content-Length", str(64 * 1024 * 1024))
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 413 and b"too large" in resp.read()
    conn.close()
    assert raw.json("GET", "/v1/status/leader")[0] == "127.0.0.1:8300"


def test_garbage_request_line_and_headers(cluster, raw):
    host, port = cluster.addr("gpu-a").rsplit(":", 1)
    for payload in (b"NOT HTTP AT ALL\r\n\r\n", b"GET /v1/status/leader HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n",
                    b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n", b"\x16\x03\x01\x00\xa5garbage\r\n\r\n"):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(payload)
            reply = sock.recv(200)
            assert reply == b"" or reply.startswith(b"HTTP/1.1 4"), reply
    assert raw.json("GET", "/v1/status/leader")[0] == "127.0.0.1:8300"


def test_unknown_endpoint_404_wrong_method_405_options(raw):
    assert raw.request("GET", "/v1/agent/nonsense")[::2] == (404, b"")
    assert raw.request("GET", "/v2/anything")[::2] == (404, b"")
    status, headers, body = raw.request("DELETE", "/v1/agent/services")
    assert (status, body, headers["allow"]) == (405, b"method DELETE not allowed", "OPTIONS,GET")
    status, headers, _ = raw.request("OPTIONS", "/v1/agent/service/register")
    assert (status, headers["allow"]) == (200, "OPTIONS,PUT")


def test_ten_thousand_registrations(cluster):
    raw = Raw(cluster.addr("gpu-b"))
    conn = http.client.HTTPConnection(raw.host, raw.port, timeout=30)  # one keep-alive connection
    try:
        for i in range(10_000):
            conn.request("PUT", "/v1/agent/service/register",
                         body=f'{{"Name": "bulk", "ID": "bulk-{i}", "Port": {i}, "Meta": {{"i": "{i}"}}}}')
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200, i
    finally:
        conn.close()
    entries, _ = raw.json("GET", "/v1/health/service/bulk")
    assert len(entries) == 10_000
    assert {e["Service"]["Port"] for e in entries} == set(range(10_000))
    assert all(e["Service"]["Meta"]["i"] == str(e["Service"]["Port"]) for e in entries)
    services, _ = raw.json("GET", "/v1/catalog/services")
    assert "bulk" in services


def test_expect_100_continue_like_curl(cluster, raw):
    host, port = cluster.addr("gpu-a").rsplit(":", 1)
    body = b"v" * 2048
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"PUT /v1/kv/expect HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                     b"Content-Length: 2048\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(body)
        reply = b""
        while not reply.endswith(b"true"):
            chunk = sock.recv(1000)
            assert chunk, reply
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 200 OK")
    assert raw.request("GET", "/v1/kv/expect?raw")[2] == body
