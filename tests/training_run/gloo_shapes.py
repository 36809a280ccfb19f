"""Event loops shaped like Gloo's, from real sockets, for tests that run without Horovod.

Gloo's TCP transport registers every descriptor of its epoll from C++ with a
pointer to its handler as the event's data.  Python's ``select.epoll`` cannot
do that (its data is always the descriptor number), so :func:`native_epoll`
calls ``epoll_ctl`` through ctypes.
"""

from __future__ import annotations

import ctypes
import os
import platform
import select
import socket

_libc = ctypes.CDLL(None, use_errno=True)
_EPOLL_CTL_ADD = 1
_POINTERS = 0x7F12_3456_7800  # what a heap pointer looks like; its low 32 bits are no descriptor number


class _EpollEvent(ctypes.Structure):
    if platform.machine() == "x86_64":
        _pack_ = 1  # the kernel's struct epoll_event is packed there (12 bytes), not elsewhere
    _fields_ = [("events", ctypes.c_uint32), ("data", ctypes.c_uint64)]


def native_epoll(fds: list[int]) -> int:
    """A new epoll descriptor watching ``fds`` for input, each registered with a pointer-like datum."""
    epoll_fd = _libc.epoll_create1(0)  # Gloo's is inheritable too
    if epoll_fd < 0:
        raise OSError(ctypes.get_errno(), "epoll_create1")
    for i, fd in enumerate(fds):
        event = _EpollEvent(select.EPOLLIN, _POINTERS + 0x40 * i)
        if _libc.epoll_ctl(epoll_fd, _EPOLL_CTL_ADD, fd, ctypes.byref(event)) != 0:
            err = ctypes.get_errno()
            os.close(epoll_fd)
            raise OSError(err, f"epoll_ctl({fd})")
    return epoll_fd


class GlooLikeLoop:
    """A wake-up pipe and ``pairs`` loopback connections in a :func:`native_epoll`, like one Gloo device.

    ``pairs`` are the loop's sockets (this "rank's" ends), ``peers`` the other
    ends (the remote ranks); ``fds`` the pairs' descriptor numbers, sorted.
    ``extra`` descriptors are registered in the same loop.  Close with
    :meth:`close` or use as a context manager.
    """

    def __init__(self, pairs: int = 2, extra: tuple[int, ...] = ()):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.pairs, self.peers = [], []
        for _ in range(pairs):
            self.pairs.append(socket.create_connection(self.server.getsockname()))
            self.peers.append(self.server.accept()[0])
        self.wake_r, self.wake_w = os.pipe()
        self.fds = sorted(s.fileno() for s in self.pairs)
        self.epoll_fd = native_epoll([self.wake_r, *self.fds, *extra])

    def close(self) -> None:
        for s in (*self.pairs, *self.peers, self.server):
            s.close()
        for fd in (self.wake_r, self.wake_w, self.epoll_fd):
            os.close(fd)

    def __enter__(self) -> "GlooLikeLoop":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
