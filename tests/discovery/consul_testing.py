"""Helpers shared by the discovery and node-agent tests (imported by both conftests).

Everything talks to real processes over real HTTP: the dev agent's Consul API,
the discovery script as a subprocess, and :class:`ScriptedServer`, a loopback
HTTP server that answers with whatever a test scripts (garbage, 5xx, silence)
to reach the failure paths a healthy Consul never takes.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
CONSUL_HOSTS = REPO / "discovery" / "consul_hosts"
HVD_ELASTIC = VENV_BIN / "hvd-elastic"


def clean_env(state_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a child: no inherited Consul or hvd-elastic settings, the venv first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONSUL_", "HVD_ELASTIC_"))}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["HVD_ELASTIC_DISCOVERY_STATE_DIR"] = str(state_dir)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_discovery(env: dict[str, str], *args: str, cli: bool = False) -> subprocess.CompletedProcess:
    """Run ``discovery/consul_hosts`` (or ``hvd-elastic discover``); 60 s guards against hangs."""
    cmd = [str(HVD_ELASTIC), "discover", *args] if cli else [str(CONSUL_HOSTS), *args]
    # A new session, as horovodrun's safe_shell_exec gives it: the first-call logic keys on it.
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, start_new_session=True)


def consul_request(addr: str, method: str, path: str, body: object = None, token: str | None = None) -> tuple[int, object]:
    """One request to a dev agent; returns (status, decoded JSON or text)."""
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    headers = {"X-Consul-Token": token} if token else {}
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        response = conn.getresponse()
        raw = response.read().decode()
    finally:
        conn.close()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, raw


def register(
    addr: str,
    service_id: str = "horovod",
    *,
    name: str = "horovod",
    slots: str | None = "1",
    address: str = "",
    tags: list[str] | None = None,
    status: str = "passing",
    ttl: str = "300s",
    token: str | None = None,
) -> None:
    """Register a service instance with one TTL check on the agent at ``addr``."""
    body = {
        "Name": name,
        "ID": service_id,
        "Address": address,
        "Tags": tags or [],
        "Meta": {} if slots is None else {"slots": slots},
        "Check": {"TTL": ttl, "Status": status},
    }
    code, answer = consul_request(addr, "PUT", "/v1/agent/service/register", body, token)
    assert code == 200, (code, answer)


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """(certificate, key) for 127.0.0.1, made by the openssl CLI; the certificate is its own CA."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ScriptedServer:
    """A loopback HTTP server whose every answer comes from ``respond(request_number)``.

    ``respond`` returns (status, body bytes), or None to accept the request and
    never answer (until the server stops).
    """

    def __init__(self, respond: Callable[[int], tuple[int, bytes] | None]):
        self.requests: list[str] = []
        self._stop = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server naming
                outer.requests.append(self.path)
                answer = respond(len(outer.requests))
                if answer is None:
                    outer._stop.wait(30)
                    return
                status, body = answer
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.addr = f"127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "ScriptedServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class RawServer:
    """A loopback TCP server that answers every request with the same raw bytes.

    For the transport's edge cases no HTTP library produces: chunked bodies,
    answers cut short, non-HTTP peers, servers that keep the connection open.
    """

    def __init__(self, answer: bytes, keep_open: bool = False):
        self.answer, self.keep_open = answer, keep_open
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.addr = f"127.0.0.1:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                request = b""
                while b"\r\n\r\n" not in request:
                    data = conn.recv(4096)
                    if not data:
                        break
                    request += data
                conn.sendall(self.answer)
                if self.keep_open:
                    self._stop.wait(10)

    def __enter__(self) -> "RawServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._sock.close()


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.2, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last value {value!r}")
        time.sleep(interval)
