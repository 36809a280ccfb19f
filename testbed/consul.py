"""Talking to a (dev) Consul agent and running discovery the way horovodrun does.

Real processes over real HTTP only: these helpers are how the discovery and
node-agent tests, and the bed's own checks, see what Consul and
``discovery/consul_hosts`` see.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from .env import CONSUL_HOSTS, HVD_ELASTIC


def run_discovery(env: dict[str, str], *args: str, cli: bool = False) -> subprocess.CompletedProcess:
    """Run ``discovery/consul_hosts`` (or ``hvd-elastic discover``); 60 s guards against hangs."""
    cmd = [str(HVD_ELASTIC), "discover", *args] if cli else [str(CONSUL_HOSTS), *args]
    # A new session, as horovodrun's safe_shell_exec gives it: the first-call logic keys on it.
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, start_new_session=True)


def consul_request(addr: str, method: str, path: str, body: object = None,
                   token: str | None = None) -> tuple[int, object]:
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


@contextlib.contextmanager
def refused_address() -> Iterator[str]:
    """``127.0.0.1:<port>`` where a connection is refused, for as long as the block runs.

    The port stays bound (never listening) until the block ends, so no other
    process can start serving on it meanwhile: unlike a port found free and
    released, the address cannot come alive under the test.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{sock.getsockname()[1]}"


class ScriptedServer:
    """A loopback HTTP server whose every answer comes from ``respond(call)``: a Consul that misbehaves on cue.

    ``call`` is a :class:`ScriptedCall` (1-based ``number``, ``method``, ``path``).
    ``respond`` returns (status, body bytes), or None to accept the request and
    never answer (until the server stops).  ``requests`` lists the paths asked
    for, ``calls`` the same as ``"METHOD path"``.  Reaches the failure paths a
    healthy Consul never takes: garbage, 5xx, silence, a text another version prints.
    """

    def __init__(self, respond: Callable[[ScriptedCall], tuple[int, bytes] | None]):
        self.requests: list[str] = []
        self.calls: list[str] = []
        self._stop = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def answer(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.requests.append(self.path)
                outer.calls.append(f"{self.command} {self.path}")
                answer = respond(ScriptedCall(len(outer.requests), self.command, self.path))
                if answer is None:
                    outer._stop.wait(30)
                    return
                status, body = answer
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_PUT = answer  # noqa: N815 - http.server naming

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.addr = f"127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class ScriptedCall(NamedTuple):
    number: int  # 1 for the first request the server got
    method: str
    path: str  # with the query string
