"""The host cache file: written by the watcher (:mod:`.watch`), read by every discovery call.

One file holds one validated host list, exactly the bytes discovery prints,
with what a reader needs to decide whether it may print them::

    hvd-elastic-hosts 1
    key <which settings produced it>
    watcher <pid> <start ticks>        the process keeping it fresh
    max-age <seconds>                  freshness bound
    answered <monotonic> <wall>        when Consul last answered (CLOCK_MONOTONIC)
    index <X-Consul-Index of that answer>
    state ok                           or: state error <why the last request failed>
    body <hosts> <warnings> <sha256 of the body>
    <host:slots lines><warning lines>

Contracts:

* Written atomically (temp file + rename in the same directory): a reader sees
  the old file or the new one, never a mix.
* A reader trusts a file only when it is a regular file owned by this user
  (or root, for an operator's cache), writable by nobody else, complete (line
  counts and checksum match) and written for the same ``key``; otherwise
  :class:`CacheInvalid` says why (a warning, never a host list).
* Even a valid file is used only while :func:`untrusted_reason` is None: its
  watcher still runs (pid and start time match), its last request succeeded,
  and Consul answered it at most ``max-age`` seconds ago.  The monotonic clock
  is the machine's (``CLOCK_MONOTONIC``), so the file is for readers on the
  same host.

Import-light (``os``, ``time`` and a SHA-256): the warm discovery path reads
this every second.
"""

from __future__ import annotations

import os
import time

from hvd_elastic.discovery.jobdir import alive

try:
    from _sha256 import sha256  # the builtin module: importing hashlib costs a millisecond more
except ImportError:  # a build with OpenSSL's hashes only
    from hashlib import sha256

MAGIC = b"hvd-elastic-hosts 1"
MAX_BYTES = 64 << 20
HEADER_LINES = 8


class CacheInvalid(Exception):
    """A cache file exists but must not be trusted; ``str()`` says why, for a warning."""


class Record:
    """The content of one cache file (``hosts`` and ``warnings`` are newline-terminated lines)."""

    __slots__ = ("key", "pid", "started", "max_age", "answered", "wall", "index", "error", "hosts", "warnings")

    def __init__(self, key: str, pid: int, started: str, max_age: float, answered: float, wall: float,
                 index: int, error: str = "", hosts: bytes = b"", warnings: bytes = b""):
        self.key, self.pid, self.started, self.max_age = key, pid, started, max_age
        self.answered, self.wall, self.index, self.error = answered, wall, index, error
        self.hosts, self.warnings = hosts, warnings


def sha256_hex(data: bytes) -> str:
    return sha256(data).hexdigest()


def render(rec: Record) -> bytes:
    """The file's bytes for ``rec``."""
    body = rec.hosts + rec.warnings
    state = "state error " + " ".join(rec.error.split()) if rec.error else "state ok"
    head = "\n".join([
        MAGIC.decode(),
        f"key {rec.key}",
        f"watcher {rec.pid} {rec.started}",
        f"max-age {rec.max_age!r}",
        f"answered {rec.answered!r} {rec.wall!r}",
        f"index {rec.index}",
        state,
        f"body {_lines(rec.hosts)} {_lines(rec.warnings)} {sha256_hex(body)}",
    ])
    return head.encode("utf-8", "replace") + b"\n" + body


def _lines(data: bytes) -> int:
    return data.count(b"\n")


def parse(data: bytes) -> Record:
    """The record in ``data``; raises :class:`CacheInvalid` when it is not a complete cache file."""
    parts = data.split(b"\n", HEADER_LINES)
    if len(parts) <= HEADER_LINES or parts[0] != MAGIC:
        raise CacheInvalid("not a host cache file (or cut short)")
    try:
        fields = [p.decode("utf-8").split(" ") for p in parts[1:HEADER_LINES]]
        (k, key), (w, pid, started), (m, max_age), (a, answered, wall), (i, index) = fields[:5]
        state, body_info = fields[5], fields[6]
        if ((k, w, m, a, i, state[0], body_info[0])
                != ("key", "watcher", "max-age", "answered", "index", "state", "body")):
            raise ValueError("field names")
        rec = Record(key, int(pid), started, float(max_age), float(answered), float(wall), int(index),
                     " ".join(state[2:]) if state[1:2] == ["error"] else "")
        if state[1:2] not in (["ok"], ["error"]):
            raise ValueError("state")
        n_hosts, n_warnings, digest = int(body_info[1]), int(body_info[2]), body_info[3]
    except (ValueError, IndexError, UnicodeDecodeError):
        raise CacheInvalid("its header is malformed") from None
    body = parts[HEADER_LINES]
    if sha256_hex(body) != digest or _lines(body) != n_hosts + n_warnings or (body and not body.endswith(b"\n")):
        raise CacheInvalid("its body is truncated or corrupt (checksum mismatch)")
    split = 0
    for _ in range(n_hosts):
        split = body.index(b"\n", split) + 1
    rec.hosts, rec.warnings = body[:split], body[split:]
    return rec


def load(path: str, key: str, owners: tuple[int, ...]) -> Record | None:
    """The record at ``path`` (None when there is no file); raises :class:`CacheInvalid`.

    ``owners`` are the user ids a trusted file may belong to.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CacheInvalid(f"it cannot be opened: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if (info.st_mode & 0o170000) != 0o100000:
            raise CacheInvalid("it is not a regular file")
        if info.st_uid not in owners:
            raise CacheInvalid(f"it belongs to uid {info.st_uid}, not to this user")
        if info.st_mode & 0o022:
            raise CacheInvalid(f"other users may write it (mode {info.st_mode & 0o777:o})")
        if info.st_size > MAX_BYTES:
            raise CacheInvalid(f"it is too large ({info.st_size} bytes)")
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, max(info.st_size + 1 - size, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_BYTES:
                raise CacheInvalid("it grew while being read")
    finally:
        os.close(fd)
    rec = parse(b"".join(chunks))
    if rec.key != key:
        raise CacheInvalid("it was written for other discovery settings")
    return rec


def untrusted_reason(rec: Record, now: float | None = None) -> str | None:
    """Why ``rec`` must not be printed now, or None when it is fresh and vouched for."""
    if rec.error:
        return f"its watcher's last request failed: {rec.error}"
    if not alive(rec.pid, rec.started):
        return f"its watcher (pid {rec.pid}) is gone"
    age = (time.monotonic() if now is None else now) - rec.answered
    if age > rec.max_age:
        return f"Consul last answered it {age:.1f} s ago (freshness bound {rec.max_age:g} s)"
    if age < -1.0:
        return "its answer time lies in the future (another machine's clock?)"
    return None


def write(path: str, rec: Record, mode: int = 0o600) -> None:
    """Replace ``path`` by ``rec`` atomically (temp file in the same directory, then rename)."""
    data = render(rec)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
