"""A simulated Consul cluster: several named nodes, each with its own agent HTTP port, one catalog.

:class:`DevCluster` is the thread-safe, importable face used by tests, the
demo and ``hvd-elastic consul-dev``; :class:`ClusterState` is everything
that lives on the event loop thread.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import ssl
import threading
import time

from hvd_elastic.consul import api
from hvd_elastic.consul.config import ConsulConfig
from hvd_elastic.consul.errors import ConsulError
from hvd_elastic.gotypes import SECOND

from .acl import Tokens
from .local_agent import LocalAgent, ReaperSettings
from .api.base import ResponseCache
from .api.dispatch import dispatch
from .catalog import Catalog
from .httpserver import HTTPServer
from .index import RaftIndex
from .kv import KVStore
from .sessions import Sessions

log = logging.getLogger(__name__)

_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}")


def validate_node_names(nodes: list[str]) -> list[str]:
    """Node names must be DNS-like labels (``localhost`` and ``127.0.0.1`` are fine) and unique."""
    if not nodes:
        raise ValueError("at least one node name is required")
    for name in nodes:
        if not _NODE_NAME.fullmatch(name):
            raise ValueError(
                f"invalid node name {name!r}: expected letters, digits, '.', '_' or '-' (at most 63)"
            )
    duplicates = sorted({n for n in nodes if nodes.count(n) > 1})
    if duplicates:
        raise ValueError(f"duplicate node name(s): {', '.join(duplicates)}")
    return list(nodes)


def _advertise(bind: str) -> str:
    """The address clients (and the catalog) should use for a listener on ``bind``."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(bind, bind)


class ClusterState:
    """The shared catalog, KV, sessions and every node's agent and HTTP server."""

    def __init__(
        self,
        nodes: list[str],
        bind: str,
        http_port: int,
        tokens: Tokens | None,
        ssl_context: ssl.SSLContext | None,
        reaper: ReaperSettings,
        datacenter: str = "dc1",
        session_ttl_min: float = 10.0,
    ) -> None:
        self.datacenter = datacenter
        self.bind = bind
        self.tokens = tokens  # the secrets accepted with ACLs on (None: ACLs off); see :mod:`.acl`
        self.reaper = reaper
        self.index = RaftIndex()
        self.catalog = Catalog(self.index, datacenter)
        self.kv = KVStore(self.index)
        self.sessions = Sessions(self.index, self.catalog, self.kv, int(session_ttl_min * SECOND))
        self.response_cache = ResponseCache()
        self.stale_lag_ms = 0  # X-Consul-LastContact of ?stale reads (see /_dev/stale-lag)
        self.health_row_cache: dict = {}  # encoded health rows by (node, service id), see api.health
        self.agents: dict[str, LocalAgent] = {}
        self.servers: dict[str, HTTPServer] = {}
        for i, name in enumerate(nodes):
            agent = LocalAgent(name, _advertise(bind), self.catalog, reaper)
            self.agents[name] = agent
            port = http_port + i if http_port else 0
            self.servers[name] = HTTPServer(functools.partial(dispatch, self, agent), bind, port, ssl_context)
        self._reaper_task: asyncio.Task | None = None

    def node_address(self, name: str) -> str:
        host = _advertise(self.bind)
        return f"[{host}]:{self.servers[name].port}" if ":" in host else f"{host}:{self.servers[name].port}"

    async def start(self) -> None:
        for name in self.agents:
            await self.start_node(name)
        self._reaper_task = asyncio.get_running_loop().create_task(self._reap_forever())

    async def start_node(self, name: str) -> None:
        agent = self.agents[name]
        if agent.running:
            return
        await self.servers[name].start()
        agent.start()
        log.info("agent %s up on %s", name, self.node_address(name))

    async def stop_node(self, name: str) -> None:
        agent = self.agents[name]
        if not agent.running:
            return
        await self.servers[name].stop()
        agent.stop()
        log.info("agent %s stopped (serfHealth critical)", name)

    async def close(self) -> None:
        if self._reaper_task is not None:
            self._reaper_task.cancel()
        for name in self.agents:
            await self.stop_node(name)

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.reaper.interval)
            for agent in self.agents.values():
                agent.reap()


class DevCluster:
    """A Consul-compatible dev cluster on loopback, run on a background event loop thread.

    ``DevCluster(nodes=["gpu-a", "gpu-b"])`` gives each node its own agent
    port (``http_port`` and up, or free ports when 0).  :meth:`start` returns
    once every node's ``/v1/status/leader`` answers; :meth:`stop_node` kills
    a node's agent (its port closes and its ``serfHealth`` turns critical),
    :meth:`start_node` brings it back on the same port.  Usable as a context
    manager.  ``reap_interval`` and ``deregister_critical_min`` shorten
    Consul's ``DeregisterCriticalServiceAfter`` reaper (30 s / 1 min) for tests,
    as ``session_ttl_min`` shortens Consul's ``session_ttl_min`` (10 s).

    ``restricted_token`` (needs ``acl_token``) adds a second token whose policy
    only reads nodes whose name starts with one of ``restricted_node_prefixes``
    and services whose name starts with one of ``restricted_service_prefixes``
    (see :mod:`.acl`): with it, listings drop what it may not read and say so
    in ``X-Consul-Results-Filtered-By-ACLs``.
    """

    kind = "dev"  # beside hvd_elastic.local.realconsul.ConsulCluster's "consul"

    def __init__(
        self,
        nodes: list[str] | tuple[str, ...] = ("gpu-a",),
        acl_token: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        reap_interval: float = 30.0,
        deregister_critical_min: float = 60.0,
        http_port: int = 0,
        bind: str = "127.0.0.1",
        datacenter: str = "dc1",
        session_ttl_min: float = 10.0,
        restricted_token: str | None = None,
        restricted_node_prefixes: list[str] | tuple[str, ...] = (),
        restricted_service_prefixes: list[str] | tuple[str, ...] = (),
    ) -> None:
        self.nodes = validate_node_names(list(nodes))
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key must be given together")
        if not 0 <= http_port <= 65535 - len(self.nodes) + 1:
            raise ValueError(f"http_port {http_port} is out of range (0 picks free ports)")
        if reap_interval <= 0 or deregister_critical_min < 0 or session_ttl_min <= 0:
            raise ValueError("reap_interval and session_ttl_min must be > 0, deregister_critical_min >= 0")
        if acl_token is not None and not acl_token:
            raise ValueError("acl_token must not be empty")
        if restricted_token is not None:
            if acl_token is None:
                raise ValueError("restricted_token needs acl_token (ACLs on)")
            if not restricted_token:
                raise ValueError("restricted_token must not be empty")
        elif restricted_node_prefixes or restricted_service_prefixes:
            raise ValueError("restricted_node_prefixes/restricted_service_prefixes need restricted_token")
        tokens = None if acl_token is None else Tokens(
            acl_token, restricted_token, restricted_node_prefixes, restricted_service_prefixes)
        self.tls = tls_cert is not None
        ssl_context = None
        if tls_cert is not None:
            ssl_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ssl_context.load_cert_chain(tls_cert, tls_key)
        self._state = ClusterState(
            self.nodes, bind, http_port, tokens, ssl_context,
            ReaperSettings(reap_interval, deregister_critical_min), datacenter, session_ttl_min,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------

    def start(self, timeout: float = 30.0) -> "DevCluster":
        if self._thread is not None:
            raise RuntimeError("DevCluster already started")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="consul-dev", daemon=True)
        self._thread.start()
        try:
            self._run(self._state.start(), timeout)
            deadline = time.monotonic() + timeout
            for name in self.nodes:
                self._wait_for_leader(name, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        try:
            if self._loop.is_running():
                self._run(self._state.close(), 30.0)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=10)
            self._loop.close()
            self._loop = None
            self._thread = None

    def __enter__(self) -> "DevCluster":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # -- nodes ------------------------------------------------------------

    def addr(self, node: str) -> str:
        """``host:port`` of ``node``'s agent HTTP API."""
        self._known(node)
        return self._state.node_address(node)

    def url(self, node: str) -> str:
        return f"{'https' if self.tls else 'http'}://{self.addr(node)}"

    def addresses(self) -> dict[str, str]:
        return {name: self.addr(name) for name in self.nodes}

    def stop_node(self, node: str) -> None:
        """Kill ``node``'s agent: its port closes, its serfHealth turns critical."""
        self._known(node)
        self._run(self._state.stop_node(node), 30.0)

    def start_node(self, node: str, timeout: float = 30.0) -> None:
        """Bring ``node``'s agent back on the same port; serfHealth passes again."""
        self._known(node)
        self._run(self._state.start_node(node), timeout)
        self._wait_for_leader(node, time.monotonic() + timeout)

    def is_running(self, node: str) -> bool:
        self._known(node)
        return self._state.agents[node].running

    def set_stale_lag(self, milliseconds: int) -> None:
        """Make ``?stale`` reads report a follower this far behind its leader (X-Consul-LastContact)."""
        self._run(_call(lambda: setattr(self._state, "stale_lag_ms", int(milliseconds))), 10.0)

    def watcher_count(self) -> int:
        """Blocking queries currently parked (for benchmarks and leak checks)."""
        return self._run(_call(lambda: self._state.index.watcher_count), 10.0)

    # -- helpers ----------------------------------------------------------

    def _known(self, node: str) -> None:
        if node not in self._state.agents:
            raise KeyError(f"unknown node {node!r} (known: {', '.join(self.nodes)})")

    def _run(self, coro, timeout: float):
        if self._loop is None:
            coro.close()
            raise RuntimeError("DevCluster is not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _wait_for_leader(self, node: str, deadline: float) -> None:
        host, port = self.addr(node).rsplit(":", 1)
        # Asked the way every client asks (hvd_elastic.consul); the dev certificate is self-signed.
        config = ConsulConfig(host=host.strip("[]"), port=int(port), scheme="https" if self.tls else "http",
                              verify=False)
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                if api.leader(config, timeout=5.0):
                    return
            except ConsulError as exc:
                last_error = exc
            time.sleep(0.05)
        raise TimeoutError(f"node {node} did not answer /v1/status/leader: {last_error}")


async def _call(fn):
    return fn()
