"""A small HTTP/1.1 server on asyncio, enough for Consul's API clients.

One event loop serves every simulated agent, so a blocking query parks as a
coroutine rather than a thread.  Supported: keep-alive, ``Content-Length``
and chunked request bodies, optional TLS.  Requests whose line or headers are
too long, or whose body exceeds ``max_body``, get a 4xx and the connection is
closed; nothing a client sends can take the server down.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import logging
import ssl
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from urllib.parse import parse_qs, unquote, urlsplit

log = logging.getLogger(__name__)

MAX_LINE = 64 * 1024
MAX_HEADERS = 100


@dataclasses.dataclass
class Request:
    method: str
    path: str  # percent-decoded, as Go's req.URL.Path
    raw_query: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-cased names
    body: bytes
    remote: str

    def arg(self, name: str, default: str = "") -> str:
        """First value of a query parameter, like Go's ``url.Values.Get``."""
        values = self.query.get(name)
        return values[0] if values else default

    def has(self, name: str) -> bool:
        return name in self.query


@dataclasses.dataclass
class Response:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = dataclasses.field(default_factory=dict)


Handler = Callable[[Request], Awaitable[Response]]


class _BadRequest(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class HTTPServer:
    """Serve ``handler`` on ``host:port`` until :meth:`stop`; restartable on the same port."""

    def __init__(
        self,
        handler: Handler,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
        max_body: int = 4 * 1024 * 1024,
    ) -> None:
        self.handler = handler
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.max_body = max_body
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task] = set()
        self._closing: asyncio.Task | None = None

    async def start(self) -> None:
        self._closing = None
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, ssl=self.ssl_context, limit=MAX_LINE,
            reuse_address=True, backlog=4096,
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Close the listener and drop every open connection (the agent died)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        # A stop requested through this very server (the /_dev control
        # endpoint) lets its own request finish; that connection then closes.
        current = asyncio.current_task()
        self._closing = current
        others = [t for t in self._connections if t is not current]
        for task in others:
            task.cancel()
        if others:
            await asyncio.gather(*others, return_exceptions=True)

    async def _serve(self, stream: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # a coroutine the server runs as a task
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        remote = f"{peer[0]}:{peer[1]}" if peer else "?"
        reader = _Input(stream)
        try:
            while True:
                try:
                    request = await self._read_request(reader, writer, remote)
                except _BadRequest as exc:
                    await self._write(writer, text_response(exc.status, exc.reason), close=True)
                    return
                if request is None:
                    return
                if request.has("index"):
                    response = await self._watch_for_hangup(request, reader)
                    if response is None:
                        return  # the client left while its blocking query was parked
                else:
                    response = await self._handle(request)
                close = request.headers.get("connection", "").lower() == "close" or self._closing is task
                await self._write(writer, response, close=close, head=request.method == "HEAD")
                if close:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, OSError):
            return
        except asyncio.CancelledError:
            return
        finally:
            self._connections.discard(task)
            writer.close()

    async def _handle(self, request: Request) -> Response:
        try:
            return await self.handler(request)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug must cost one request, never the server
            log.exception("internal error serving %s %s", request.method, request.path)
            return text_response(500, "Internal Server Error")

    async def _watch_for_hangup(self, request: Request, reader: "_Input") -> Response | None:
        """Run a (possibly long) blocking query, abandoning it if the client disconnects.

        Without this a client that gives up on a parked query (a discovery
        script bounding its own time) would leave it, and its socket, parked
        until the wait ran out.
        """
        handler = asyncio.ensure_future(self._handle(request))
        probe = asyncio.ensure_future(reader.stream.read(1))
        done, _ = await asyncio.wait({handler, probe}, return_when=asyncio.FIRST_COMPLETED)
        if probe in done:
            data = probe.result()
            if not data:
                handler.cancel()
                await asyncio.gather(handler, return_exceptions=True)
                return None
            reader.pending += data  # the start of a pipelined request
            return await handler
        probe.cancel()
        await asyncio.gather(probe, return_exceptions=True)
        if probe.done() and not probe.cancelled() and probe.exception() is None:
            reader.pending += probe.result()
        return handler.result()

    async def _read_request(
        self, reader: "_Input", writer: asyncio.StreamWriter, remote: str
    ) -> Request | None:
        try:
            line = await reader.readline()
        except (ValueError, asyncio.LimitOverrunError):
            raise _BadRequest(414, "Request URI too long") from None
        if not line:
            return None
        parts = line.decode("latin-1").strip().split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _BadRequest(400, "Malformed HTTP request line")
        method, target, _version = parts
        headers: dict[str, str] = {}
        for _ in range(MAX_HEADERS + 1):
            try:
                raw = await reader.readline()
            except (ValueError, asyncio.LimitOverrunError):
                raise _BadRequest(431, "Request header fields too large") from None
            if raw in (b"\r\n", b"\n", b""):
                break
            name, sep, value = raw.decode("latin-1").partition(":")
            if not sep:
                raise _BadRequest(400, "Malformed HTTP header")
            headers[name.strip().lower()] = value.strip()
        else:
            raise _BadRequest(431, "Request header fields too large")
        if headers.get("expect", "").lower() == "100-continue":
            # curl asks before sending a large body; Go's server says go ahead (unless it is too large).
            length = headers.get("content-length", "0")
            if not length.isdigit() or int(length) <= self.max_body:
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = await self._read_body(reader, headers)
        split = urlsplit(target)
        return Request(
            method=method,
            path=unquote(split.path),
            raw_query=split.query,
            query=parse_qs(split.query, keep_blank_values=True),
            headers=headers,
            body=body,
            remote=remote,
        )

    async def _read_body(self, reader: "_Input", headers: dict[str, str]) -> bytes:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            total = 0
            while True:
                size_line = await reader.readline()
                try:
                    size = int(size_line.split(b";")[0].strip(), 16)
                except ValueError:
                    raise _BadRequest(400, "Malformed chunked body") from None
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                total += size
                if total > self.max_body:
                    raise _BadRequest(413, f"Request body too large, max size: {self.max_body} bytes")
                chunks.append(await reader.readexactly(size))
                await reader.readline()
        length = headers.get("content-length", "0") or "0"
        if not length.isdigit():
            raise _BadRequest(400, f"Invalid Content-Length {length!r}")
        if int(length) > self.max_body:
            raise _BadRequest(
                413, f"Request body({length} bytes) too large, max size: {self.max_body} bytes"
            )
        return await reader.readexactly(int(length)) if int(length) else b""

    @staticmethod
    async def _write(writer: asyncio.StreamWriter, response: Response, close: bool, head: bool = False) -> None:
        reason = HTTPStatus(response.status).phrase if response.status in HTTPStatus._value2member_map_ else ""
        lines = [f"HTTP/1.1 {response.status} {reason}"]
        headers = dict(response.headers)
        headers["Date"] = email.utils.formatdate(usegmt=True)
        headers["Content-Length"] = str(len(response.body))
        if close:
            headers["Connection"] = "close"
        lines += [f"{k}: {v}" for k, v in headers.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if not head:
            writer.write(response.body)
        await writer.drain()


class _Input:
    """A StreamReader with room to put back bytes read while watching for a hang-up."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.stream = stream
        self.pending = b""

    async def readline(self) -> bytes:
        if self.pending:
            head, sep, rest = self.pending.partition(b"\n")
            if sep:
                self.pending = rest
                return head + sep
            self.pending = b""
            return head + await self.stream.readline()
        return await self.stream.readline()

    async def readexactly(self, n: int) -> bytes:
        head, self.pending = self.pending[:n], self.pending[n:]
        if len(head) < n:
            head += await self.stream.readexactly(n - len(head))
        return head


def text_response(status: int, reason: str) -> Response:
    """A plain-text answer, the way Consul writes its error reasons."""
    return Response(status, reason.encode(), {"Content-Type": "text/plain; charset=utf-8"})

