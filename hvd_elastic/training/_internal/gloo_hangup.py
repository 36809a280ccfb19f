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
Horovod also raises ``HorovodInternalError`` for errors that lose no peer
(tensors of different shapes on different ranks).  Its background loop then
keeps cycling with every peer, so nobody waits on this rank, and cutting that
live context is not harmless: Gloo queues a send that meets ``EPIPE`` or
``ECONNRESET`` without failing it (``tcp::Pair::write``, async mode), and a
pair that fails never tells the queued sends of unbound buffers
(``Pair::signalException``), so a background thread that sent into the cut
waits out the whole Gloo timeout inside ``hvd.shutdown()`` (``gdb``:
``UnboundBuffer::waitSend`` in the ring allreduce of Horovod's cache
coordination; 3 runs in about 20 of a two-rank job under load).  So after a
failure the elastic loop calls :func:`hang_up_if_stalled`: it hangs up only
once this rank's Gloo connections have been quiet for :data:`STALL_QUIET_S`
(a world whose loop died is quiet on every connection: a collective needs
every rank), and leaves a world that keeps talking for :data:`STALL_WINDOW_S`
alone.

Which sockets are Gloo's (:func:`gloo_sockets`): Gloo's TCP transport runs
one event loop per device, an epoll instance watching a wake-up PIPE and the
device's TCP connections (its pairs; no listener), each registered by C++
code with a pointer to its handler object as the event's data.  A loop is
taken for Gloo's only when it has exactly that shape:

* at least one pipe and at least one other descriptor, every other one a TCP
  connection (asyncio wakes up through a UNIX socket pair; ``socketserver``
  and multiprocessing use poll, not epoll);
* no registration carries its own descriptor number as data.  Python's
  ``select.epoll`` (so ``selectors``, asyncio, Twisted's epoll reactor) and
  the common C loops (libuv, libevent, libev) register every descriptor so:
  a hand-written loop woken by a pipe that watches only client connections is
  therefore left alone.

A registration is matched to a descriptor by number AND by the inode the
kernel names for it: a number whose file went away while another reference
kept the registration, or was reused since, is not Gloo's.

:func:`check_found` tells, once a world of two or more ranks is up, whether
that shape is still found (a newer Gloo that registers its listener in the
same loop would make the hang-up silently match nothing).

Off switch: ``HVD_ELASTIC_GLOO_HANGUP=0`` (the worker's ``gloo_hangup``
setting, :mod:`hvd_elastic.training.settings`): the elastic loop and the
health cut then never call it.  Without Linux's ``/proc`` it finds nothing
and does nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import struct
import time
from typing import NamedTuple

from hvd_elastic.fds import FD_DIR, FDINFO_DIR

log = logging.getLogger(__name__)

#: After a failure: seconds without data on every Gloo connection that mean this rank's world has stopped
#: (Horovod's background loop exchanges with every peer each cycle, a few milliseconds).
STALL_QUIET_S = 0.2
#: After a failure: how long a world that keeps talking is watched before it is taken for alive.
STALL_WINDOW_S = 0.5



class Endpoint(NamedTuple):
    """A descriptor number and the inode of the socket it named when it was listed."""

    fd: int
    inode: int


class _Registration(NamedTuple):
    fd: int  # the number it was registered under
    data: int  # the epoll event's data (64 bits)
    inode: int | None  # of the registered file; None on kernels that do not print it


def _target(fd: int) -> str:
    try:
        return os.readlink(f"{FD_DIR}/{fd}")
    except OSError:
        return ""


def _registrations(epoll_fd: int) -> list[_Registration] | None:
    """What an epoll instance watches: its ``tfd:`` lines in fdinfo.

    ``tfd: 11 events: 19 data: 7f1fd0005dd0 pos:0 ino:10bb7 sdev:9`` (hex
    numbers but the first).  None when a line is in a format we do not know:
    such a loop is never taken for Gloo's.
    """
    try:
        with open(f"{FDINFO_DIR}/{epoll_fd}") as f:
            lines = [line.split() for line in f if line.startswith("tfd:")]
    except OSError:
        return None
    found = []
    for fields in lines:
        try:
            data = fields[fields.index("data:") + 1]
            inode = next((int(f[len("ino:"):], 16) for f in fields if f.startswith("ino:")), None)
            found.append(_Registration(int(fields[1]), int(data, 16), inode))
        except (ValueError, IndexError):
            return None
    return found


def _socket_at(fd: int, inode: int) -> socket.socket | None:
    """A duplicate of ``fd`` as a socket object if ``fd`` still names socket ``inode``, else None.

    The caller closes the object (that closes the duplicate only); nothing is
    left open when None is returned.
    """
    try:
        dup = os.dup(fd)
    except OSError:
        return None
    try:
        st = os.fstat(dup)
        if stat.S_ISSOCK(st.st_mode) and st.st_ino == inode:
            return socket.socket(fileno=dup)  # owns dup from here
    except OSError:
        pass
    os.close(dup)
    return None


def _is_tcp_stream(endpoint: Endpoint) -> bool:
    """A TCP socket that is not a listener: connected, or once connected and since reset by its peer."""
    sock = _socket_at(*endpoint)
    if sock is None:
        return False
    with sock:
        try:
            return (sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6)
                    and not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
        except OSError:
            return False


def _gloo_endpoints(epoll_fd: int) -> list[Endpoint]:
    """The TCP connections of one epoll instance if it is shaped like Gloo's loop, else []."""
    pipes, others = 0, []
    for reg in _registrations(epoll_fd) or ():
        if (reg.data & 0xFFFFFFFF) == reg.fd:
            return []  # registered the way Python's and C's loops do (the upper half may be junk)
        try:
            st = os.fstat(reg.fd)
        except OSError:
            continue  # closed since: the registration outlives it only through another reference
        if reg.inode is not None and st.st_ino != reg.inode:
            continue  # the number now names another file
        if stat.S_ISFIFO(st.st_mode):
            pipes += 1
        else:
            others.append(Endpoint(reg.fd, st.st_ino))
    if pipes and others and all(_is_tcp_stream(e) for e in others):
        return others
    return []


def gloo_endpoints() -> list[Endpoint]:
    """This process's Gloo pair sockets with their inodes (see the module docstring), sorted.

    After a crash some of them are already reset by the dead peer (no longer
    connected, still registered): they belong to the shape too, or the loop of
    a survivor that lost two peers would not be recognised.
    """
    try:
        names = os.listdir(FD_DIR)
    except OSError:
        return []
    found: set[Endpoint] = set()
    for name in names:
        if name.isdigit() and _target(int(name)) == "anon_inode:[eventpoll]":
            found.update(_gloo_endpoints(int(name)))
    return sorted(found)


def gloo_sockets() -> list[int]:
    """The descriptor numbers of :func:`gloo_endpoints`."""
    return [e.fd for e in gloo_endpoints()]


# struct tcp_info (linux/tcp.h): eight one-byte fields, then u32s; tcpi_last_data_recv is the
# twelfth u32 (offset 52) -- milliseconds since the kernel last received data (not a bare ACK) on the socket.
_TCP_INFO_LAST_DATA_RECV = struct.Struct("=I")
_TCP_INFO_LAST_DATA_RECV_OFFSET = 8 + 4 * 11


def _quiet_ms(endpoint: Endpoint) -> int | None:
    """Milliseconds since ``endpoint`` last received data; None when it cannot be told."""
    sock = _socket_at(*endpoint)
    if sock is None:
        return None
    with sock:
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LAST_DATA_RECV_OFFSET + 4)
        except OSError:
            return None
    if len(info) < _TCP_INFO_LAST_DATA_RECV_OFFSET + 4:
        return None
    return _TCP_INFO_LAST_DATA_RECV.unpack_from(info, _TCP_INFO_LAST_DATA_RECV_OFFSET)[0]


def quiet_for() -> float | None:
    """Seconds since any of this process's Gloo connections last received data; None if none is found.

    Horovod's background loop negotiates with its peers every cycle
    (``HOROVOD_CYCLE_TIME``, milliseconds), also while the training code
    computes or writes a checkpoint, so a live world is never quiet for
    seconds, while a world whose collective waits on a lost peer is quiet on
    EVERY connection: a ring stalls as a whole.
    """
    quiet = [ms for ms in map(_quiet_ms, gloo_endpoints()) if ms is not None]
    return min(quiet) / 1000.0 if quiet else None


def hang_up(why: str = "of the failed Horovod context") -> list[int]:
    """Shut down this process's Gloo connections (see the module docstring); return their descriptors.

    Call it when this rank's Horovod failed (``HorovodInternalError``), before
    the reset, or to MAKE it fail: a collective in flight then fails at once
    on this rank and on every peer it talks to (:mod:`.health_cut` does so for
    a peer host Consul judged lost).  A descriptor that no longer names the
    socket it named when listed is left alone.
    """
    done = []
    for endpoint in gloo_endpoints():
        sock = _socket_at(*endpoint)
        if sock is None:
            continue
        with sock:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # acts on the socket, which the duplicate shares
            except OSError:
                pass  # already reset by the peer: nothing to tell it
        done.append(endpoint.fd)
    if done:
        log.info("hung up %d Gloo connections %s", len(done), why)
    return done


def hang_up_if_stalled(quiet: float = STALL_QUIET_S, window: float = STALL_WINDOW_S) -> list[int]:
    """After this rank's Horovod failed: :func:`hang_up` once its Gloo connections have been quiet for
    ``quiet`` seconds, within ``window`` seconds; [] when they keep receiving data (the world is alive, so
    nobody waits on this rank) or none is found."""
    deadline = time.monotonic() + window
    while (seconds := quiet_for()) is not None and seconds < quiet:
        if time.monotonic() + (quiet - seconds) > deadline:
            log.info("Gloo connections still busy %.1f s after the failure: the world is alive, not hung up", window)
            return []
        time.sleep(quiet - seconds)
    return hang_up() if seconds is not None else []


def check_found() -> bool:
    """Whether Gloo's loop is found in this process; if not, log a warning saying what that costs.

    Call it once per run, in a world of two or more ranks under Gloo (a world
    of one has no pairs, so no loop to find).
    """
    if gloo_endpoints():
        return True
    log.warning("no epoll loop shaped like Gloo's was found (Horovod's Gloo may have changed): after a "
                "failure peers waiting on this rank wait out HOROVOD_GLOO_TIMEOUT_SECONDS, and forked "
                "children keep its Gloo connections; see %s", __name__)
    return False
