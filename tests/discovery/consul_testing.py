"""Helpers of the discovery tests.

Everything talks to real processes over real HTTP: the dev agent's Consul API
and the discovery script as a subprocess (helpers shared with the node-agent
tests and the test bed, in :mod:`testbed.consul`, re-exported
here, :class:`ScriptedServer` among them), and :class:`RawServer`, which
answers with bytes that are not even HTTP.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from testbed import child_env
from testbed.consul import ScriptedServer, consul_request, register, run_discovery, self_signed_cert  # noqa: F401 (re-exported)


def clean_env(state_dir: Path, **extra: str) -> dict[str, str]:
    """:func:`testbed.child_env` with discovery's first-call state in ``state_dir``."""
    return child_env(discovery_state=state_dir, **extra)


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

