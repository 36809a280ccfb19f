"""Serve one Prometheus registry over HTTP from a daemon thread, or say in one line why not."""

from __future__ import annotations

import logging
import os
import threading

from prometheus_client import CollectorRegistry, start_http_server

from hvd_elastic.fds import release
from hvd_elastic.metrics.address import MetricsAddressError, parse

TYPE_CHECKING = False
if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

log = logging.getLogger(__name__)

_live: set["Exporter"] = set()
_hook_lock = threading.Lock()
_hook_installed = False


class Exporter:
    """``http://HOST:PORT/metrics`` for ``registry`` while started.

    :meth:`start` never raises for the address: a bad one, or one that cannot be
    bound, is logged once as one line naming it (what the exporter is for, the
    address, the reason) and :meth:`start` returns None.  A process forked
    from this one (a DataLoader worker) does not keep the listening socket: a
    port must close when the process that serves it dies.
    """

    def __init__(self, registry: CollectorRegistry, what: str) -> None:
        self.registry = registry
        self.what = what
        self._server: WSGIServer | None = None
        self._failed: set[str] = set()  # addresses already reported, so a retry per reset logs once

    @property
    def address(self) -> tuple[str, int] | None:
        """The bound ``(host, port)`` (the real port when 0 was asked), or None when not serving."""
        return None if self._server is None else _bound(self._server)

    def start(self, spec: str, source: str) -> tuple[str, int] | None:
        """Serve at ``spec`` (``[HOST]:PORT``, from ``source``: a flag or variable name); the bound address
        when serving, None when not."""
        if self._server is not None:
            return _bound(self._server)
        try:
            host, port = parse(spec, source)
            server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except (MetricsAddressError, OSError) as exc:
            reason = (str(exc) if isinstance(exc, MetricsAddressError)
                      else f"cannot listen on {spec}: {exc.strerror or exc}")
            if reason not in self._failed:
                self._failed.add(reason)
                log.error("%s metrics are off: %s", self.what, reason)
            return None
        self._server = server
        _release_in_children(self)
        host, port = _bound(server)
        log.info("%s metrics at http://%s:%d/metrics", self.what, f"[{host}]" if ":" in host else host, port)
        return host, port

    def stop(self) -> None:
        """Stop serving and close the port.  Idempotent."""
        server, self._server = self._server, None
        _live.discard(self)
        if server is not None:
            server.shutdown()
            server.server_close()


def _bound(server: WSGIServer) -> tuple[str, int]:
    host, port = server.server_address[:2]
    return str(host), port  # an AF_INET/AF_INET6 address: the host is text


def _release_in_children(exporter: Exporter) -> None:
    global _hook_installed
    with _hook_lock:
        _live.add(exporter)
        if not _hook_installed:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _hook_installed = True


def _after_fork_in_child() -> None:
    # The serving thread is not in the child, but the listening socket is: released, the port
    # closes with the parent, and the inherited server object cannot act on an unrelated file later.
    servers = [exporter._server for exporter in _live if exporter._server is not None]
    for exporter in _live:
        exporter._server = None
    _live.clear()
    try:
        release(server.socket.fileno() for server in servers)
    except OSError:
        pass  # never break a fork
