"""Two ranks: rank 0 hangs up its Gloo connections while rank 1 waits in an allreduce.

Rank 0 also holds the kinds of connection a user's code may own (a TCP
connection of its own, an epoll watching a UNIX socket pair and a TCP socket,
like asyncio's loop, and a selectors loop woken by a pipe watching only a
client connection) and checks they survive.  After the hang-up rank 0
stays alive until rank 1 has reported (at most ``PATIENCE`` seconds), so rank
1 can tell a hang-up from the end of rank 0's process: it records whether
rank 0 had already finished when its allreduce failed.  Each rank writes
``OUT/rank<N>.json``.
"""

import json
import os
import select
import selectors
import socket
import sys
import time

import torch

import horovod.torch as hvd
from hvd_elastic.training import settings
from hvd_elastic.training._internal import gloo_hangup

out = sys.argv[1]
PATIENCE = 20.0
hvd.init()
hvd.allreduce(torch.ones(1), name="warm-up")  # every Gloo pair is connected by now
report: dict = {"rank": hvd.rank()}

if hvd.rank() == 0:
    server = socket.create_server(("127.0.0.1", 0))
    user = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    waker, woken = socket.socketpair()
    loop = select.epoll()
    loop.register(woken.fileno(), select.EPOLLIN)
    loop.register(user.fileno(), select.EPOLLIN)
    client = socket.create_connection(server.getsockname())
    client_peer, _ = server.accept()
    wake_r, wake_w = os.pipe()
    selector = selectors.EpollSelector()
    selector.register(wake_r, selectors.EVENT_READ)
    selector.register(client, selectors.EVENT_READ)
    user_fds = {user.fileno(), accepted.fileno(), server.fileno(), waker.fileno(), woken.fileno(),
                client.fileno(), client_peer.fileno()}

    found = gloo_hangup.gloo_sockets()
    report["found"] = len(found)
    report["user_sockets_found"] = sorted(user_fds & set(found))
    # Hang up once rank 1 is in its allreduce, waiting on this rank (a bare sleep was too short under load).
    deadline = time.monotonic() + PATIENCE
    while not os.path.exists(os.path.join(out, "rank1.entering")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)
    # As the library's callers do: only when the worker's gloo_hangup setting is on.
    report["hung_up"] = len(gloo_hangup.hang_up()) if settings.from_environment().gloo_hangup else 0
    try:  # whatever fails here is reported: an exception would leave Horovod's exit waiting on its peer
        for sock in (accepted, client_peer):
            sock.settimeout(10)
        user.sendall(b"still here")
        client.sendall(b"and here")
        report["user_connection_works"] = accepted.recv(16) == b"still here" and client_peer.recv(16) == b"and here"
    except OSError as exc:
        report["user_connection_works"] = f"{type(exc).__name__}: {exc}"
    deadline = time.monotonic() + PATIENCE
    while not os.path.exists(os.path.join(out, "rank1.json")) and time.monotonic() < deadline:
        time.sleep(0.1)
else:
    try:
        open(os.path.join(out, "rank1.entering"), "w").close()
        hvd.allreduce(torch.ones(1), name="never-answered")
        report["error"] = None
    except Exception as exc:  # HorovodInternalError, whatever Horovod wraps it in
        report["error"] = f"{type(exc).__name__}: {exc}"
    report["rank0_had_finished"] = os.path.exists(os.path.join(out, "rank0.json"))

with open(os.path.join(out, f"rank{report['rank']}.json"), "w") as f:
    json.dump(report, f)
os._exit(0)  # Horovod's shutdown would wait on the hung-up peer
