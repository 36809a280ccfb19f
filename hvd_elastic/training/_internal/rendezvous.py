"""Horovod's elastic rendezvous server, as a worker sees it: its two questions, and a relay that answers one.

horovodrun's driver serves one HTTP key-value store (``horovod/runner/http/
http_server.py``, address in the workers' ``HOROVOD_GLOO_RENDEZVOUS_ADDR`` and
``_PORT``).  Two of its uses matter here:

* ``GET /rank_and_size/<host>:<local_rank>``: what a worker's re-initialisation
  asks first (``gloo_context.cc``, elastic mode after a shutdown).  The driver
  records the worker as ready for the next world and answers only when every
  worker of the current world has done so or ended
  (``registration.py: WorkerStateRegistry``): then it starts the new world's
  workers and answers ``rank,size,local_rank,local_size,cross_rank,cross_size``
  (``-1,...`` for a slot that is not in the new world);
* ``/global/<rank>``: where each rank of a forming world publishes its Gloo
  address (``gloo/rendezvous/context.cc: connectFullMesh``); the driver clears
  the store when it starts a world, so a key there is a rank of the newest
  world already waiting for its peers.

A worker that asked the first question early (:mod:`.join_ahead`) must not ask
it again at its re-initialisation: a second question would record it as
leaving the world that has just started.  :func:`answered_init` runs
``hvd.init()`` against a :class:`Relay` on loopback that answers that question
from the early answer and forwards every other request to the driver.

Inside ``hvd.init()`` a rank is past saving: Gloo waits for every peer up to
``HOROVOD_GLOO_TIMEOUT_SECONDS`` and then aborts the process, state and all.
So a survivor asks its question itself and enters ``hvd.init()`` only once
every rank of the new world has arrived (:func:`next_world`): with
horovodrun's driver rules (:mod:`hvd_elastic.horovodrun`), a world that lost
a worker meanwhile is doomed, and the survivor asks again, for the world after
it, with its state intact.

A world can still be doomed after its ranks arrived, while they connect their
Gloo pairs (a host frozen or cut off just then).  A rank waiting on that
host's connection can never complete its ``hvd.init()``; Gloo would abort it
after its timeout.  :func:`leave_if_doomed` ends it once the driver has called
its world doomed for :data:`DOOM_GRACE_S` (exit :data:`DOOMED_EXIT`), after one
more request to Gloo's store that the driver refuses, so it does not hold the
host out for it.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from hvd_elastic.envvars import env_seconds
from hvd_elastic.horovodrun import READY_SCOPE, RESUMABLE_PATH, WORLD_PATH

log = logging.getLogger(__name__)

ADDR_ENV = "HOROVOD_GLOO_RENDEZVOUS_ADDR"
PORT_ENV = "HOROVOD_GLOO_RENDEZVOUS_PORT"
RANK_AND_SIZE = "rank_and_size"
GLOBAL_SCOPE = "global"  # HOROVOD_GLOO_GLOBAL_PREFIX
FORWARD_TIMEOUT_S = 30.0  # the relay's wait for the driver; the driver answers store requests at once
GLOO_TIMEOUT_ENV = "HOROVOD_GLOO_TIMEOUT_SECONDS"
GLOO_TIMEOUT_DEFAULT_S = 30.0  # gloo_context.cc's default
POLL_S = 0.05  # a forming world's poll: one small request to the driver (Gloo's own store polls every 10 ms)
# Rule 5's 503s fail Gloo's own store requests within about 1.5 s (Horovod's client tries three times); a rank still
# inside hvd.init() past that waits on a connection that cannot complete.
DOOM_GRACE_S = 2.0
DOOM_POLL_S = 0.5
DOOMED_EXIT = 75  # EX_TEMPFAIL: this process's world was given up while it connected; its slot starts anew
#: What a request to the server may raise when the driver is busy, gone or answers nonsense.
ERRORS = (OSError, http.client.HTTPException)


@dataclass(frozen=True)
class Server:
    """The driver's rendezvous server."""

    addr: str
    port: int

    @classmethod
    def from_env(cls) -> Server | None:
        """The server horovodrun named in this worker's environment; None outside an elastic Gloo job."""
        addr, port = os.environ.get(ADDR_ENV, ""), os.environ.get(PORT_ENV, "")
        if not addr or not port.isdigit() or os.environ.get("HOROVOD_ELASTIC") != "1":
            return None
        return cls(addr, int(port))

    def request(self, method: str, path: str, body: bytes | None = None,
                timeout: float | None = FORWARD_TIMEOUT_S) -> tuple[int, bytes]:
        """One HTTP request; its status and body.  ``timeout=None`` waits as long as the driver does."""
        connection = http.client.HTTPConnection(self.addr, self.port, timeout=timeout)
        try:
            connection.request(method, path, body=body)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def ask_rank_and_size(self, host: str, local_rank: int) -> str:
        """Record this slot ready for the next world and return its place there (blocks until the
        driver's barrier passes, as a re-initialisation does)."""
        status, body = self.request("GET", f"/{RANK_AND_SIZE}/{host}:{local_rank}", timeout=None)
        if status != 200:
            raise OSError(f"rendezvous server {self.addr}:{self.port} answered {status} to rank_and_size")
        return body.decode("ascii")

    def announce_resumable(self) -> None:
        """Tell horovodrun's driver rules that a durable checkpoint exists (:mod:`hvd_elastic.horovodrun`)."""
        self.request("PUT", RESUMABLE_PATH, body=b"1", timeout=5.0)

    def world(self) -> World | None:
        """The forming world as the driver rules see it; None from a driver without them (404)."""
        status, body = self.request("GET", WORLD_PATH, timeout=5.0)
        if status == 404:
            return None
        if status != 200:
            raise OSError(f"rendezvous server {self.addr}:{self.port} answered {status} to {WORLD_PATH}")
        fields = json.loads(body)
        min_np = fields.get("min_np")
        return World(tuple(fields["hosts"]), frozenset(fields["present"]), fields["doomed"],
                     min_np if isinstance(min_np, int) and not isinstance(min_np, bool) else None)

    def waiting(self, ranks: Iterable[int]) -> set[int]:
        """Those of ``ranks`` that have published their address in the forming world."""
        return {rank for rank in ranks if self.request("GET", f"/{GLOBAL_SCOPE}/{rank}", timeout=5.0)[0] == 200}


def gloo_timeout() -> float:
    """How long Gloo's rendezvous inside ``hvd.init()`` waits for a peer (ConfigError for a bad value)."""
    return env_seconds(GLOO_TIMEOUT_ENV, GLOO_TIMEOUT_DEFAULT_S)


@dataclass(frozen=True)
class World:
    """A forming world: its hosts by rank, the ranks that arrived, why it cannot form ('' while it can), and
    horovodrun's ``--min-np`` (None from rules that do not say)."""

    hosts: tuple[str, ...]
    present: frozenset[int]
    doomed: str
    min_np: int | None = None


def rank_and_size(answer: str) -> tuple[int, int]:
    """This slot's rank and the new world's size in a ``rank_and_size`` answer (-1 when not in it)."""
    fields = answer.split(",")
    if len(fields) != 6:
        raise ValueError(f"rank_and_size answer {answer!r}: expected six comma-separated numbers")
    return int(fields[0]), int(fields[1])


def world_size(answer: str) -> int:
    """The new world's size in a ``rank_and_size`` answer (-1 when this slot is not in it)."""
    return rank_and_size(answer)[1]


def next_world(server: Server, host: str, local_rank: int, answer: str | None,
               timeout: float) -> tuple[str, tuple[str, ...]]:
    """This slot's answer for the next world that can form, and that world's hosts by rank.

    Asks ``rank_and_size`` (unless ``answer`` is this slot's answer already),
    says this rank is ready and waits until every rank is (or already in
    Gloo's rendezvous); while the driver calls the world doomed, asks again
    for the next one.  After ``timeout`` s without a verdict it returns, so
    ``hvd.init()`` waits its own Gloo timeout as it would have; never longer.

    Raises:
        OSError, http.client.HTTPException: the question itself failed (the caller's ``hvd.init()`` asks it).
    """
    while True:
        if answer is None:
            answer = server.ask_rank_and_size(host, local_rank)
        rank, size = rank_and_size(answer)
        if rank < 0 or size < 2:
            return answer, ()
        try:
            server.request("PUT", f"/{READY_SCOPE}/{rank}", body=host.encode(), timeout=5.0)
            world = _arrivals(server, size, time.monotonic() + timeout)
        except ERRORS as exc:
            log.warning("could not follow the new world's arrivals (%s): entering hvd.init() now", exc)
            return answer, ()
        if not world.doomed:
            return answer, world.hosts
        log.warning("the new world of %d cannot form (%s): asking for the next one", size, world.doomed)
        answer = None


def _arrivals(server: Server, size: int, deadline: float) -> World:
    while True:
        world = server.world()
        if world is None:
            return World((), frozenset(), "")
        if world.doomed or world.present >= set(range(size)):
            return world
        if time.monotonic() > deadline:
            missing = sorted(set(range(size)) - world.present)
            log.warning("ranks %s of the new world did not arrive in time: entering hvd.init() without them, "
                        "which waits HOROVOD_GLOO_TIMEOUT_SECONDS more", missing)
            return world
        time.sleep(POLL_S)


class Relay(http.server.ThreadingHTTPServer):
    """Loopback HTTP server: ``rank_and_size`` answered with ``answer``, everything else forwarded to
    ``upstream`` (status and body unchanged)."""

    daemon_threads = True

    def __init__(self, upstream: Server, answer: str):
        super().__init__(("127.0.0.1", 0), _RelayHandler)
        self.upstream = upstream
        self.answer = answer.encode("ascii")


class _RelayHandler(http.server.BaseHTTPRequestHandler):
    server: Relay

    def do_GET(self) -> None:
        if self.path.startswith(f"/{RANK_AND_SIZE}/"):
            self._reply(200, self.server.answer)
        else:
            self._forward()

    def do_PUT(self) -> None:
        self._forward()

    def do_DELETE(self) -> None:
        self._forward()

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        try:
            status, reply = self.server.upstream.request(self.command, self.path, body)
        except ERRORS:
            status, reply = 502, b""  # Horovod's store client retries anything but 200 and 404
        self._reply(status, reply)

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 -- the base class's name
        pass  # Gloo polls the store every 10 ms: one line per request would drown the job's output


@contextlib.contextmanager
def answered_init(answer: str) -> Iterator[None]:
    """Within the block, this process's rendezvous server is a :class:`Relay` that gives ``answer`` to
    ``rank_and_size``: call ``hvd.init()`` in it.  The real server is named again on leaving."""
    upstream = Server.from_env()
    if upstream is None:
        raise RuntimeError(f"answered_init: {ADDR_ENV}/{PORT_ENV} do not name an elastic rendezvous server")
    relay = Relay(upstream, answer)
    thread = threading.Thread(target=relay.serve_forever, name="hvd-elastic-rendezvous-relay", daemon=True)
    thread.start()
    # Horovod reads both variables with getenv() during hvd.init(); os.environ writes through to it.
    os.environ[ADDR_ENV], os.environ[PORT_ENV] = "127.0.0.1", str(relay.server_address[1])
    try:
        yield
    finally:
        os.environ[ADDR_ENV], os.environ[PORT_ENV] = upstream.addr, str(upstream.port)
        # shutdown() waits out serve_forever's poll (0.5 s): the new world need not wait with it.
        threading.Thread(target=_close, args=(relay, thread), name="hvd-elastic-relay-close", daemon=True).start()


def _close(relay: Relay, thread: threading.Thread) -> None:
    relay.shutdown()
    relay.server_close()
    thread.join()


@contextlib.contextmanager
def leave_if_doomed(server: Server | None, exit_process: Callable[[int], None] = os._exit) -> Iterator[None]:
    """Within the block (a reset's ``hvd.init()``), end this process once the driver has called the forming
    world doomed for :data:`DOOM_GRACE_S` seconds.  Nothing without a server or with a driver without the
    rules."""
    if server is None:
        yield
        return
    inside = threading.Event()
    inside.set()
    thread = threading.Thread(target=_watch_doom, args=(server, inside, exit_process), name="hvd-elastic-doom-watch",
                              daemon=True)
    thread.start()
    try:
        yield
    finally:
        inside.clear()


def _watch_doom(server: Server, inside: threading.Event, exit_process: Callable[[int], None]) -> None:
    doomed_since = None
    while inside.is_set():
        time.sleep(DOOM_POLL_S)
        try:
            world = server.world()
        except ERRORS:
            continue  # the driver busy or restarting: Gloo's own timeout still bounds the wait
        if world is None:
            return  # a driver without hvd-elastic's rules: nobody dooms a world
        doomed_since = (doomed_since or time.monotonic()) if world.doomed else None
        if doomed_since is not None and time.monotonic() - doomed_since >= DOOM_GRACE_S and inside.is_set():
            log.warning("the world this rank is connecting into was given up (%s): leaving hvd.init(), whose "
                        "connections cannot complete, instead of waiting out Gloo's timeout", world.doomed)
            with contextlib.suppress(*ERRORS):  # refused (503): the driver does not hold this host out for it
                server.request("GET", f"/{GLOBAL_SCOPE}/0", timeout=2.0)
            for handler in logging.getLogger().handlers:
                handler.flush()
            exit_process(DOOMED_EXIT)
            return
