"""Helpers of the discovery tests.

Everything talks to real processes over real HTTP: the dev agent's Consul API
and the discovery script as a subprocess (helpers shared with the node-agent
tests and the test bed, in :mod:`hvd_elastic.testbed.consul`, re-exported
here), and :class:`ScriptedServer`, a loopback HTTP server that answers with
whatever a test scripts (garbage, 5xx, silence) to reach the failure paths a
healthy Consul never takes.
"""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Callable
from pathlib import Path

from hvd_elastic.testbed import child_env
from hvd_elastic.testbed.consul import consul_request, register, run_discovery, self_signed_cert  # noqa: F401 (re-exported)


def clean_env(state_dir: Path, **extra: str) -> dict[str, str]:
    """:func:`hvd_elastic.testbed.child_env` with discovery's first-call state in ``state_dir``."""
    return child_env(discovery_state=state_dir, **extra)


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

