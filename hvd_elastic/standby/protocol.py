"""What a launcher and its standby agree on: where the socket is, the messages, the fingerprint.

Stdlib only: the launcher imports this on every worker start.

* **Socket.** ``<dir>/standby-<name>.sock``, a ``SOCK_SEQPACKET`` Unix socket
  (one message per send, boundaries kept, file descriptors alongside).
  ``<dir>`` is ``HVD_ELASTIC_STANDBY_DIR``, else ``$XDG_RUNTIME_DIR/hvd-elastic``,
  else ``/tmp/hvd-elastic-<uid>``; the standby makes it mode 0700 and the socket
  0600, and also checks each peer's uid (``SO_PEERCRED``).  ``<name>`` is the
  job's standby name (``HVD_ELASTIC_STANDBY``, default ``default``): two jobs on
  one node use two names and never reach each other's standby.
* **Conversation.**  The standby speaks first: ``{"hello": FINGERPRINT,
  "python": sys.executable, "netns": NETWORK NAMESPACE, "pid": PID}``; a launcher in another
  network namespace (a container or test-bed host that shares the socket's file
  system) never uses it, since its worker would run on the wrong host.  The launcher, if that matches what it expects,
  sends ``{"run": {"argv", "env", "cwd", "unbuffered"}}`` with its stdin, stdout
  and stderr as SCM_RIGHTS.  The standby answers ``{"pid": N}`` once the worker
  is forked (or ``{"refused": why}``), and ``{"exit": CODE}`` or
  ``{"signal": N}`` when it ends.  The launcher closing the socket early means
  "the worker must go": the standby terminates it.
* **Fingerprint.**  The protocol version and a hash of this package's source,
  so a standby started before an upgrade (stale) is never used by a newer
  launcher.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from pathlib import Path

from hvd_elastic.envvars import Check
from hvd_elastic.errors import HvdElasticError

PROTOCOL = 1
NAME_ENV = "HVD_ELASTIC_STANDBY"
DIR_ENV = "HVD_ELASTIC_STANDBY_DIR"
DEFAULT_NAME = "default"
MAX_MESSAGE = 1 << 20  # an environment of a megabyte is already absurd
STDIO_FDS = 3
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes with its terminating NUL


class ProtocolError(HvdElasticError, RuntimeError):
    """The other side sent something this side does not understand."""


NAME_RULE = "1-64 letters, digits, '-', '_' or '.', not starting with '.' or '-'"


def valid_name(name: str) -> bool:
    return 0 < len(name) <= 64 and all(c.isalnum() or c in "-_." for c in name) and name[0] not in ".-"


NAME = Check(str, valid_name, f"a standby name ({NAME_RULE})")  # the type of every flag that names a standby


def socket_dir() -> Path:
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV])
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "hvd-elastic"
    return Path(f"/tmp/hvd-elastic-{os.getuid()}")


def socket_path(name: str) -> Path:
    if not valid_name(name):
        raise ValueError(f"standby name {name!r} is not {NAME_RULE}")
    path = socket_dir() / f"standby-{name}.sock"
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ValueError(f"standby socket path {path} is over the {MAX_SOCKET_PATH} bytes a Unix socket address "
                         f"holds: set {DIR_ENV} to a shorter directory")
    return path


def network_namespace() -> str:
    """This process's network namespace ("" where /proc does not say): a worker must run in the launcher's."""
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return ""


def fingerprint() -> str:
    """``<protocol>-<hash of this package's .py files>``: equal only for the same code."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"{PROTOCOL}-{digest.hexdigest()[:16]}"


def connect(name: str, timeout: float) -> tuple[socket.socket, dict | None]:
    """Connect to standby ``name`` and read its first message (None: it closed at once).

    Raises OSError (FileNotFoundError: no socket; ConnectionRefusedError: a socket
    nobody listens on; socket.timeout: no answer within ``timeout``) or ProtocolError.
    The socket is left with ``timeout`` set; the caller closes it.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.settimeout(timeout)
        sock.connect(str(socket_path(name)))
        first, _ = receive(sock)
    except BaseException:
        sock.close()
        raise
    return sock, first


def unusable(hello: dict | None) -> str | None:
    """Why a standby that sent ``hello`` cannot fork this process's workers (None: it can).

    The same question for the launcher (fall back) and the node agent's gate (not ready).
    """
    if hello is None or "hello" not in hello:
        return "closed the connection without a hello" + (f": {hello.get('refused')}" if hello else "")
    if hello["hello"] != fingerprint():
        return f"runs other code ({hello['hello']}, this launcher is {fingerprint()}): restart it"
    if hello.get("netns") != network_namespace():
        return f"runs in another network namespace ({hello.get('netns')}): its workers would not be on this host"
    return None


def send(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"message of {len(data)} bytes is over the {MAX_MESSAGE}-byte limit")
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.sendall(data)


def receive(sock: socket.socket, max_fds: int = 0) -> tuple[dict | None, list[int]]:
    """One message and the descriptors that came with it; (None, []) when the peer closed.

    Raises :class:`ProtocolError` (closing any descriptors that came) for a
    truncated or malformed message.
    """
    data, fds, flags, _ = socket.recv_fds(sock, MAX_MESSAGE + 1, max_fds)
    try:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise ProtocolError("message or descriptors truncated")
        if not data:
            if fds:
                raise ProtocolError("descriptors without a message")
            return None, []
        try:
            message = json.loads(data)
        except ValueError as exc:
            raise ProtocolError(f"not JSON: {exc}") from None
        if not isinstance(message, dict):
            raise ProtocolError("not a JSON object")
    except ProtocolError:
        for fd in fds:
            os.close(fd)
        raise
    return message, fds
