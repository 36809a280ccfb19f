"""scripts/grafana/hvd-elastic-job.json imports cleanly and asks only for series the exporters serve.

Grafana's importer needs the declared data-source input, unique panel ids and a
grid of 24 columns; every PromQL expression must parse (``promtool check
rules``, with Grafana's variables given values) and every ``hvd_elastic_*``
name in it must be one the job's or the node agent's exporter writes.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from hvd_elastic.metrics.job import JobMetrics
from hvd_elastic.metrics.nodeagent import NodeAgentMetrics
from testbed import REPO, prometheus

DASHBOARD = REPO / "scripts" / "grafana" / "hvd-elastic-job.json"
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range_s": "3600", "$__range": "1h", "$node_job": ".*", "$job": ".*"}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def expressions(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    return exprs + [a["expr"] for a in dashboard["annotations"]["list"] if "expr" in a]


def served_names() -> set[str]:
    """Every series name the two exporters write (histogram and counter suffixes included)."""
    job, node = CollectorRegistry(), NodeAgentMetrics()
    metrics = JobMetrics()
    metrics.on_checkpoint(True, 1.0, 5)  # the checkpoint gauges appear once one was written
    job.register(metrics)
    node.on_maintenance("horovod", False)
    text = (generate_latest(job) + generate_latest(node.registry)).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_it_has_what_the_importer_needs(dashboard):
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    inputs = {i["name"] for i in dashboard["__inputs"] if i["type"] == "datasource" and i["pluginId"] == "prometheus"}
    assert inputs == {"DS_PROMETHEUS"}
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), ids
    cells = set()
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert all(isinstance(g[k], int) and g[k] >= 0 for k in "xywh") and g["w"] > 0 and g["h"] > 0, p["title"]
        assert g["x"] + g["w"] <= 24, f"{p['title']} overflows the 24-column grid"
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"{p['title']} overlaps another panel"
        cells |= mine
        assert p["datasource"]["uid"] == "${DS_PROMETHEUS}" and p["targets"], p["title"]
        assert [t["refId"] for t in p["targets"]] == [chr(65 + i) for i in range(len(p["targets"]))]
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    used = {m for e in expressions(dashboard) for m in re.findall(r"\$(\w+)", e) if not m.startswith("__")}
    assert used <= variables, used - variables


def test_it_asks_only_for_served_series(dashboard):
    served = served_names()
    asked = {name for e in expressions(dashboard) for name in re.findall(r"\bhvd_elastic_\w+", e)}
    assert asked and asked <= served, sorted(asked - served)
    # What the issue asks a dashboard to show is there: world size, resets, recovery, time lost.
    for needed in ("hvd_elastic_world_size", "hvd_elastic_resets_total", "hvd_elastic_recovery_seconds_bucket",
                   "hvd_elastic_not_training_seconds_total"):
        assert needed in asked


def test_every_expression_parses(dashboard, tmp_path):
    if reason := prometheus.unavailable_reason():
        pytest.skip(reason)
    rules = []
    for i, expr in enumerate(expressions(dashboard)):
        for var, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(var, value)
        rules.append({"record": f"dashboard:expr_{i}", "expr": expr})
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    check = subprocess.run([str(prometheus.PROMTOOL), "check", "rules", str(path)], capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"{len(rules)} rules found" in check.stdout
