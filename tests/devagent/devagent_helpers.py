"""Helpers shared by the dev agent's tests (clients over real HTTP, polling)."""

from __future__ import annotations

import http.client
import json
import time

import consul

from hvd_elastic.devagent import DevCluster


def client(cluster: DevCluster, node: str = "gpu-a", **kwargs) -> consul.Consul:
    host, port = cluster.addr(node).rsplit(":", 1)
    return consul.Consul(host=host, port=int(port), **kwargs)


class Raw:
    """Raw HTTP to one node, for status codes, headers and exact bodies."""

    def __init__(self, addr: str) -> None:
        self.host, port = addr.rsplit(":", 1)
        self.port = int(port)

    def request(self, method: str, path: str, body=None, headers=None, timeout: float = 30.0):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            if body is not None and not isinstance(body, (bytes, str)):
                body = json.dumps(body)
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        finally:
            conn.close()

    def json(self, method: str, path: str, body=None, headers=None):
        status, hdrs, data = self.request(method, path, body, headers)
        assert status == 200, (status, data)
        return json.loads(data), hdrs


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.05):
    """Poll ``predicate`` until truthy; return its value or fail with the last one."""
    deadline = time.monotonic() + timeout
    value = predicate()
    while not value and time.monotonic() < deadline:
        time.sleep(interval)
        value = predicate()
    assert value, f"condition not met within {timeout}s"
    return value


def check_status(c: consul.Consul, check_id: str) -> str | None:
    check = c.agent.checks().get(check_id)
    return check and check["Status"]
