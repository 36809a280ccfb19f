"""One HTTP request over a socket, bounded by a deadline: the ONE transport every Consul call uses.

Why not ``http.client``: importing it (and the ``email`` and ``ssl`` packages
it pulls in) took about 40% of a discovery call's start-up, and horovodrun
starts the script every second; ``benchmarks/discovery_speed.py`` holds the
call to 5x ``python3 -c pass``.  The subset of HTTP/1.1 needed to read
Consul's JSON answers is small and fully covered here: one request with
``Connection: close``, a status line, headers, and a body delimited by
``Content-Length``, chunked transfer coding, or the end of the connection.
``ssl`` is imported only for ``https``.

The node agent's writes (a JSON body) and doctor's reads travel the same way,
so every command shares one set of TLS, deadline and error rules.

Contract: :func:`request` returns ``(status, headers, body)`` with header names in
lower case, or raises ``TimeoutError`` (deadline passed), ``OSError``
(connection, TLS), :class:`BadAnswer` (not HTTP, or cut short) or
:class:`InvalidHeader`.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Generator

_READ = 1 << 16
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
MAX_HEAD = 1 << 16  # status line and headers; Consul's are a few hundred bytes


class InvalidHeader(Exception):
    """A request header value would break the request (control characters)."""


class BadAnswer(Exception):
    """The peer's answer is not a complete HTTP response."""

    def __init__(self, message: str, *, truncated: bool = False):
        super().__init__(message)
        self.truncated = truncated  # True when waiting and asking again may help


def remaining(deadline: float) -> float:
    """Seconds left until ``deadline`` (monotonic clock); TimeoutError when none."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    return left


def request(method: str, host: str, port: int, target: str, headers: dict[str, str], deadline: float, ssl_context=None,
            server_hostname: str | None = None, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """``method`` ``target`` (path and query, already quoted) with ``body`` before ``deadline``."""
    for name, value in headers.items():
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name + value):
            raise InvalidHeader(f"header {name} contains control characters")
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"{method} {target} HTTP/1.1", f"Host: {authority}", "Connection: close",
             *(f"{k}: {v}" for k, v in headers.items())]
    if method != "GET" or body:
        lines.append(f"Content-Length: {len(body)}")
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    # An ASCII host as bytes skips the idna codec's import (unicodedata, stringprep).
    dial = host.encode("ascii") if host.isascii() else host
    sock = socket.create_connection((dial, port), timeout=remaining(deadline))  # type: ignore[arg-type]
    try:
        if ssl_context is not None:
            sock.settimeout(remaining(deadline))
            sock = ssl_context.wrap_socket(sock, server_hostname=server_hostname or host)
        sock.settimeout(remaining(deadline))
        sock.sendall(request)
        return _read_response(sock, deadline)
    finally:
        sock.close()


def _read_response(sock: socket.socket, deadline: float) -> tuple[int, dict[str, str], bytes]:
    buf = bytearray()
    head_end = -1
    status, length = 0, None
    headers: dict[str, str] = {}
    while True:
        if head_end < 0:
            head_end = buf.find(b"\r\n\r\n")
            if head_end >= 0:
                status, headers = _parse_head(bytes(buf[:head_end]))
                length = _content_length(headers)
            elif len(buf) > MAX_HEAD:
                raise BadAnswer("no end of HTTP headers")
        if length is not None and len(buf) - head_end - 4 >= length:
            break  # complete: no need to wait for the server to close
        # A chunked body is complete at its last chunk, whether or not the server (or a proxy in between)
        # closes the connection then: waiting for the close would spend the call's whole deadline.
        if head_end >= 0 and length is None and _is_chunked(headers) and _chunked_end(buf, head_end + 4):
            break
        sock.settimeout(remaining(deadline))
        data = sock.recv(_READ)
        if not data:
            break
        buf += data
    if head_end < 0:
        raise BadAnswer("not an HTTP response" if buf else "connection closed without an answer", truncated=not buf)
    body = bytes(buf[head_end + 4:])
    if length is not None:
        if len(body) < length:
            raise BadAnswer(f"connection closed after {len(body)} of {length} body bytes", truncated=True)
        return status, headers, body[:length]
    if _is_chunked(headers):
        return status, headers, _dechunk(body)
    return status, headers, body


def _is_chunked(headers: dict[str, str]) -> bool:
    return headers.get("transfer-encoding", "").lower() == "chunked"


def _chunked_end(buf: bytearray, pos: int) -> bool:
    """Whether ``buf[pos:]`` holds a whole chunked body, last chunk and trailer included."""
    spans = _chunk_spans(buf, pos)
    try:
        while True:
            next(spans)
    except StopIteration as last:
        trailer = last.value
        return buf[trailer:trailer + 2] == b"\r\n" or buf.find(b"\r\n\r\n", trailer) >= 0
    except BadAnswer as exc:
        return not exc.truncated  # malformed: stop reading, _dechunk says what is wrong


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    version, _, rest = status_line.partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit() or len(code) != 3:
        raise BadAnswer(f"not an HTTP status line: {status_line[:80]!r}")
    headers = {}
    for line in header_lines:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(code), headers


def _content_length(headers: dict[str, str]) -> int | None:
    if _is_chunked(headers) or "content-length" not in headers:
        return None  # chunked wins over Content-Length (RFC 9112 6.3)
    text = headers["content-length"]
    if not text.isdigit():
        raise BadAnswer(f"bad Content-Length {text[:40]!r}")
    return int(text)


def _chunk_spans(data: bytes | bytearray, pos: int = 0) -> Generator[tuple[int, int], None, int]:
    """(start, size) of each data chunk of the chunked body at ``data[pos:]``; returns the position after
    the last (empty) chunk's size line.  Raises BadAnswer, ``truncated`` when the body is cut short."""
    while True:
        line_end = data.find(b"\r\n", pos)
        if line_end < 0:
            raise BadAnswer("chunked body cut short", truncated=True)
        size_text = bytes(data[pos:line_end]).split(b";", 1)[0].strip()
        if not _HEX.fullmatch(size_text):
            raise BadAnswer(f"bad chunk size {size_text[:20]!r}")
        size = int(size_text, 16)
        start = line_end + 2
        if size == 0:
            return start
        if len(data) < start + size + 2:
            raise BadAnswer("chunked body cut short", truncated=True)
        yield start, size
        pos = start + size + 2


def _dechunk(data: bytes) -> bytes:
    return b"".join(data[start:start + size] for start, size in _chunk_spans(data))
