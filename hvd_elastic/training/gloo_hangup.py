"""When this rank's Horovod fails, hang up its Gloo connections at once, so no peer waits on it.

Measured on the multi-host bed (3 hosts, Gloo timeout 15 s): after one rank is
SIGKILLed, a survivor whose collective touched the dead rank fails at once,
its Horovod background loop ends, and its Python code resets within 0.1 s.
But Horovod leaves that loop's Gloo context -- and so its TCP connections --
open until the next ``hvd.init()`` replaces it.  A second survivor that was
waiting on the FIRST survivor (Horovod's negotiation runs through rank 0)
hears nothing from it and waits out the whole Gloo timeout: in 2 of 4 crashes
recovery took 15.1-15.2 s instead of 0.2-0.3 s (``ss`` showed the first
survivor's connections to the second still established 3 s after it had
reset).  Both Horovod and stock ``hvd.elastic.run`` behave so.

:func:`hang_up` shuts down (``shutdown(SHUT_RDWR)``: the peer gets an end of
stream now) every connection of the failed Gloo contexts, so the peer's
receive fails with "Connection closed by peer" and it resets too.  The
descriptors stay Gloo's: it closes them when the old context goes away.

Which sockets are Gloo's: Gloo's TCP transport runs one event loop per
device, an epoll instance watching a wake-up PIPE and the device's TCP
sockets (its pairs; no listener).  Nothing else we know of in a training process has
that shape: asyncio's loops wake up through a UNIX socket pair, and
``socketserver`` and multiprocessing use poll, not epoll.  An epoll watching
anything else is left alone, so a user's connections are not cut.

Off switch: ``HVD_ELASTIC_GLOO_HANGUP=0`` (any false value of
:func:`hvd_elastic.consul.config.parse_bool`).  Without Linux's ``/proc`` it
finds nothing and does nothing.
"""

from __future__ import annotations

import logging
import os
import socket

from hvd_elastic.consul.config import parse_bool

log = logging.getLogger(__name__)

#: Set to a false boolean ("0", "false") to turn the hang-up off.
ENV = "HVD_ELASTIC_GLOO_HANGUP"

FD_DIR = "/proc/self/fd"
FDINFO_DIR = "/proc/self/fdinfo"


def enabled() -> bool:
    value = os.environ.get(ENV, "")
    return parse_bool(ENV, value) if value else True


def _target(fd: int) -> str:
    try:
        return os.readlink(f"{FD_DIR}/{fd}")
    except OSError:
        return ""


def _watched(epoll_fd: int) -> list[int]:
    """The descriptors an epoll instance watches (its ``tfd:`` lines in fdinfo)."""
    try:
        with open(f"{FDINFO_DIR}/{epoll_fd}") as f:
            return [int(line.split()[1]) for line in f if line.startswith("tfd:")]
    except (OSError, ValueError, IndexError):
        return []


def _is_tcp_stream(fd: int) -> bool:
    """A TCP socket that is not a listener: connected, or once connected and since reset by its peer."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    try:
        return (sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6)
                and not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
    except OSError:
        return False
    finally:
        sock.close()  # the duplicate only


def gloo_sockets() -> list[int]:
    """This process's Gloo pair sockets: the TCP sockets of every epoll shaped like Gloo's loop.

    After a crash some of them are already reset by the dead peer (no longer
    connected, still registered): they belong to the shape too, or the loop of
    a survivor that lost two peers would not be recognised.
    """
    try:
        names = os.listdir(FD_DIR)
    except OSError:
        return []
    found: list[int] = []
    for name in names:
        if not name.isdigit() or _target(int(name)) != "anon_inode:[eventpoll]":
            continue
        watched = _watched(int(name))
        pipes = [fd for fd in watched if _target(fd).startswith("pipe:")]
        others = [fd for fd in watched if fd not in pipes]
        if pipes and others and all(_is_tcp_stream(fd) for fd in others):
            found.extend(others)
    return sorted(set(found))


def hang_up() -> list[int]:
    """Shut down this process's Gloo connections (see the module docstring); return their descriptors.

    Call it when this rank's Horovod failed (``HorovodInternalError``), before
    the reset; never while the context is in use.
    """
    if not enabled():
        return []
    fds = gloo_sockets()
    for fd in fds:
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            sock.shutdown(socket.SHUT_RDWR)  # shutdown acts on the socket, which the duplicate shares
        except OSError:
            pass  # already reset by the peer: nothing to tell it
        finally:
            sock.close()
    if fds:
        log.info("hung up %d Gloo connections of the failed Horovod context", len(fds))
    return fds
