"""The dev agent's health answers at discovery's scale: rows re-encoded per change, never stale or different.

``/v1/health/service/<name>`` without ``?filter`` joins per-row encodings cached
by modify index; with a filter it encodes whole dicts.  Both must give the
same JSON, and a change must show in the very next answer.
"""

from __future__ import annotations

import json

from consul_testing import consul_request, register

from hvd_elastic.devagent import DevCluster

ALWAYS = "Service.Service == horovod"  # a filter every row passes: the dict path


def health(addr: str, query: str) -> tuple[list, int]:
    code, rows = consul_request(addr, "GET", f"/v1/health/service/horovod?{query}")
    assert code == 200, rows
    return rows, len(json.dumps(rows))


def test_cached_rows_equal_the_full_encoding_and_follow_changes():
    with DevCluster(nodes=["a", "b"]) as cluster:
        for i in range(300):
            register(cluster.addr("ab"[i % 2]), f"s{i}", address=f"10.0.{i // 256}.{i % 256}", slots=str(1 + i % 8))
        fast, _ = health(cluster.addr("a"), "passing=1")
        full, _ = health(cluster.addr("a"), f"passing=1&filter={ALWAYS.replace(' ', '%20')}")
        assert fast == full and len(fast) == 300

        consul_request(cluster.addr("b"), "PUT", "/v1/agent/check/fail/service:s7?note=down")
        consul_request(cluster.addr("a"), "PUT", "/v1/agent/check/update/service:s8",
                       {"Status": "passing", "Output": "new output"})
        consul_request(cluster.addr("b"), "PUT", "/v1/agent/service/deregister/s9")
        after, _ = health(cluster.addr("a"), "passing=1")
        assert {r["Service"]["ID"] for r in fast} - {r["Service"]["ID"] for r in after} == {"s7", "s9"}
        s8 = next(r for r in after if r["Service"]["ID"] == "s8")
        assert [c["Output"] for c in s8["Checks"] if c["ServiceID"] == "s8"] == ["new output"]
        every, _ = health(cluster.addr("a"), "")
        assert next(r for r in every if r["Service"]["ID"] == "s7")["Checks"][-1]["Status"] == "critical"
        assert after == health(cluster.addr("a"), f"passing=1&filter={ALWAYS.replace(' ', '%20')}")[0]
