"""Does a host Consul judges lost still answer the launcher?  The reaper's check before it acts.

A host's TTL check goes critical when its node agent stops renewing it: the
host hung or dropped off the network -- or only the node agent died while the
host's workers train on.  The first is the reaper's business (horovodrun would
wait for those sessions until TCP gives up); the second is a graceful resize
that ending the sessions would turn into a failure and a rollback: discovery
drops the host and its workers leave at their next commit.  So the reaper asks
this module first, about the sessions it would end:

- a remote session: its ``ssh`` client's TCP connection names the address and
  port at which horovodrun reached the host's sshd, whatever ssh's own
  configuration aliased.  A fresh connection there that receives sshd's
  identification string (``SSH-``, RFC 4253 section 4.2) within
  :data:`PROBE_S` means the host's kernel and sshd run: it answers.  A
  partitioned host answers nothing, and a frozen one's kernel may accept the
  connection but its sshd never speaks.
  An ssh client with no established TCP connection of its own (still
  connecting, multiplexed through a ControlMaster, or tunnelled through a
  ProxyCommand/ProxyJump) cannot be probed: it does not answer, as before this
  check existed -- a hang costs more than a rollback.
- a local session (no ssh client: the host is this machine): it answers while
  any of the session's leaf processes (the workers) is not stopped.

Only addresses horovodrun itself connected to are probed; no host name is resolved.
"""

from __future__ import annotations

import socket
import time

from hvd_elastic import procfs

PROBE_S = 2.0  # sshd greets at once; a host that has not within this is not answering
_GREETING = b"SSH-"
_NOT_RUNNING = frozenset("TtZXx")  # stopped, traced, zombie, dead


def _ssh_clients(members: dict[int, procfs.Stat]) -> list[int]:
    """The session's own ssh clients (not one that a ProxyJump client started)."""
    return [pid for pid, st in members.items()
            if st.comm == "ssh" and getattr(members.get(st.ppid), "comm", None) != "ssh"]


def sshd_greets(address: str, port: int, timeout: float = PROBE_S) -> bool:
    """Whether an sshd at ``address``:``port`` sends its identification string within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((address, port), timeout=timeout) as sock:
            got = b""
            while len(got) < len(_GREETING):
                sock.settimeout(max(deadline - time.monotonic(), 0.01))
                chunk = sock.recv(len(_GREETING) - len(got))
                if not chunk:
                    return False
                got += chunk
            return got == _GREETING
    except OSError:  # refused, unreachable, timed out
        return False


def _leaves_run(members: dict[int, procfs.Stat]) -> bool:
    parents = {st.ppid for st in members.values()}
    return any(st.state not in _NOT_RUNNING for pid, st in members.items() if pid not in parents)


def answers(sids: list[int]) -> tuple[bool, str]:
    """Whether the host behind horovodrun's sessions ``sids`` answers, and how that was told (module docstring)."""
    wanted = set(sids)
    members = {pid: st for pid, st in procfs.all_stats().items() if st.sid in wanted}
    clients = _ssh_clients(members)
    if clients:
        peer = next((peer for pid in clients for peer in procfs.established_peers(pid)), None)
        if peer is None:  # still connecting, or through a ControlMaster or a proxy: nothing of its own to probe
            return False, "its ssh client holds no established connection of its own to probe"
        address, port = peer
        greeted = sshd_greets(address, port)
        return greeted, (f"its sshd at {address}:{port} "
                         f"{'greeted' if greeted else f'did not greet within {PROBE_S:.0f} s'}")
    if _leaves_run(members):
        return True, "its workers on this machine run"
    return False, "its workers on this machine are stopped or gone"
