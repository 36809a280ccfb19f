"""Where the dev agent was found to differ from HashiCorp Consul 1.8.7, pinned on both (``cluster`` runs each test
twice).

Each of these failed on the dev agent before it was fixed; see the table in
:mod:`hvd_elastic.devagent` for the differences that remain.
"""

from __future__ import annotations

import time

import pytest
from consul_testing import consul_request, register

pytestmark = pytest.mark.slow


def test_an_agent_restart_keeps_only_the_ttl_updates_consul_persists(cluster):
    """Consul persists a TTL check's state on each update, and restores it on restart only while that
    update's TTL lasts: a check never updated, or whose TTL ran out, comes back critical."""
    other = cluster.addr("127.0.0.1")
    register(other, "never", slots="1")  # registered passing, never updated
    register(other, "fresh", slots="1")
    register(other, "expired", slots="1", ttl="2s")
    for service in ("fresh", "expired"):
        assert consul_request(other, "PUT", f"/v1/agent/check/pass/service:{service}?note=ok")[0] == 200
    cluster.stop_node("127.0.0.1")
    time.sleep(2.5)  # the 2 s TTL of the last update of "expired" runs out while the agent is down
    cluster.start_node("127.0.0.1")
    code, checks = consul_request(other, "GET", "/v1/agent/checks")
    assert code == 200
    assert {k: v["Status"] for k, v in checks.items()} == {
        "service:never": "critical", "service:fresh": "passing", "service:expired": "critical"}
    assert checks["service:fresh"]["Output"] == "ok"  # the update's own output comes back with it
