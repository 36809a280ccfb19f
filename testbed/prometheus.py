"""A real Prometheus for the tests: scrape hvd-elastic's exporters, then ask its HTTP API.

The binaries are ``prometheus`` and ``promtool`` next to the venv's Python, put
there by ``scripts/fetch-prometheus.sh`` (from ``scripts/bootstrap.sh``):
Debian 12's Prometheus 2.42.  :class:`Prometheus` runs one server on loopback
with a throw-away TSDB; :meth:`Prometheus.query` and :meth:`Prometheus.series`
read it back as a user's dashboard would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from hvd_elastic.local import ports

from .env import VENV_BIN, fetched_binary_missing

PROMETHEUS = VENV_BIN / "prometheus"
PROMTOOL = VENV_BIN / "promtool"


def unavailable_reason() -> str | None:
    """Why real Prometheus cannot run here (one line), or None."""
    return fetched_binary_missing("Prometheus", "fetch-prometheus.sh", PROMETHEUS, PROMTOOL)


def check_metrics(exposition: bytes) -> subprocess.CompletedProcess:
    """``promtool check metrics`` on one scrape (its lint of names, units, help and types)."""
    return subprocess.run([str(PROMTOOL), "check", "metrics"], input=exposition, capture_output=True, timeout=60)


class Prometheus:
    """``prometheus`` serving on a free loopback port, with ``config`` (a dict written as YAML-compatible JSON)."""

    def __init__(self, config: dict, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_file = self.workdir / "prometheus.yml"
        self.config_file.write_text(json.dumps(config, indent=2))  # JSON is YAML
        self.port = ports.reserve()[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.workdir / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> "Prometheus":
        check = subprocess.run([str(PROMTOOL), "check", "config", str(self.config_file)], capture_output=True,
                               text=True, timeout=60)
        if check.returncode != 0:
            raise RuntimeError(f"promtool rejects {self.config_file}: {check.stdout}{check.stderr}")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(PROMETHEUS), f"--config.file={self.config_file}", f"--web.listen-address=127.0.0.1:{self.port}",
                 f"--storage.tsdb.path={self.workdir / 'data'}", "--storage.tsdb.retention.time=1d"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready after {timeout:g}s: {self.log_tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)

    def __enter__(self) -> "Prometheus":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def api(self, path: str, **params: str) -> dict:
        """``GET /api/v1/<path>``'s ``data``; raises when Prometheus answers an error."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=30) as answer:
            body = json.load(answer)
        if body.get("status") != "success":
            raise RuntimeError(f"{url}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query's result vector: ``[{"metric": {...}, "value": [t, "v"]}, ...]``."""
        return self.api("query", query=expr)["result"]

    def value(self, expr: str) -> float | None:
        """The single value of an instant query, or None when it has no result."""
        result = self.query(expr)
        if not result:
            return None
        if len(result) > 1:
            raise AssertionError(f"{expr} has {len(result)} series: {result}")
        return float(result[0]["value"][1])

    def series(self, expr: str, start: float, end: float | None = None, step: float = 0.5) -> list[tuple[float, float]]:
        """``(time, value)`` of one range query's only series (empty when none)."""
        end = time.time() if end is None else end
        result = self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step}")["result"]
        if len(result) > 1:
            raise AssertionError(f"{expr} has {len(result)} series")
        return [(float(t), float(v)) for t, v in result[0]["values"]] if result else []

    def targets(self) -> list[dict]:
        """The active scrape targets with their ``health`` and ``labels``."""
        return self.api("targets")["activeTargets"]
