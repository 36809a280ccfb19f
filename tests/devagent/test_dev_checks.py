"""HTTP and TCP checks against real local listeners, and the DeregisterCriticalServiceAfter reaper."""

from __future__ import annotations

import http.server
import socket
import threading

import consul
import pytest
from devagent_helpers import check_status, wait_until


class _Handler(http.server.BaseHTTPRequestHandler):
    code = 200

    def do_GET(self):  # noqa: N802 (http.server's naming)
        body = f"status {self.server.code}".encode()
        self.send_response(self.server.code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def http_target():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.code = 200
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_http_check_follows_the_endpoint_status(c, http_target):
    url = f"http://127.0.0.1:{http_target.server_address[1]}/health"
    c.agent.service.register("httpsvc", service_id="httpsvc", check=consul.Check.http(url, interval="1s", timeout="2s"))
    check = c.agent.checks()["service:httpsvc"]
    assert (check["Type"], check["Interval"], check["Timeout"]) == ("http", "1s", "2s")
    wait_until(lambda: check_status(c, "service:httpsvc") == "passing", timeout=10)
    assert c.agent.checks()["service:httpsvc"]["Output"] == f"HTTP GET {url}: 200 OK Output: status 200"
    http_target.code = 429
    wait_until(lambda: check_status(c, "service:httpsvc") == "warning", timeout=10)
    http_target.code = 503
    wait_until(lambda: check_status(c, "service:httpsvc") == "critical", timeout=10)
    c.agent.service.deregister("httpsvc")


def test_tcp_check_passes_while_listening(c):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        c.agent.service.register("tcpsvc", service_id="tcpsvc", check=consul.Check.tcp("127.0.0.1", port, "1s"))
        wait_until(lambda: check_status(c, "service:tcpsvc") == "passing", timeout=10)
        assert c.agent.checks()["service:tcpsvc"]["Output"] == f"TCP connect 127.0.0.1:{port}: Success"
    finally:
        listener.close()
    wait_until(lambda: check_status(c, "service:tcpsvc") == "critical", timeout=10)
    c.agent.service.deregister("tcpsvc")


def test_deregister_critical_service_after_reaps(c):
    # The cluster fixture shortens the reaper to 0.5 s with a 1 s minimum (Consul: 30 s / 1 min).
    check = consul.Check.ttl("30s")
    check["DeregisterCriticalServiceAfter"] = "1s"
    c.agent.service.register("reaped", service_id="reaped", check=check)
    c.agent.service.register("kept", service_id="kept", check=consul.Check.ttl("30s"))
    wait_until(lambda: "reaped" not in c.agent.services(), timeout=10)
    assert "kept" in c.agent.services()  # critical too, but without DeregisterCriticalServiceAfter
    assert c.health.service("reaped")[1] == []


def test_passing_service_is_not_reaped(c):
    check = consul.Check.ttl("30s")
    check["DeregisterCriticalServiceAfter"] = "1s"
    c.agent.service.register("healthy", service_id="healthy", check=check)
    c.agent.check.ttl_pass("service:healthy")
    # A critical twin registered after it: once the reaper took the twin, it has
    # looked at "healthy" past the same deadline too.
    c.agent.service.register("doomed-twin", service_id="doomed-twin", check=check)
    wait_until(lambda: "doomed-twin" not in c.agent.services(), timeout=10)
    assert "healthy" in c.agent.services()
    c.agent.service.deregister("healthy")
