"""Checkpoint storage every rank sees: the marker check a job makes before each sync.

Rank 0 writes the checkpoints, and after a whole-job restart rank 0 may be on
another host.  A ``checkpoint_dir`` that is local to each host (node-local
disk, a path that differs per host) makes that "resume" start over from
nothing, silently.  :func:`verify` catches it while the job starts, before
rank 0 loads a checkpoint, and again whenever a process joins.

Contracts:

* :func:`verify` is collective: every rank of a world calls it at the same
  point (the runner calls it before every ``sync``: the first world, every
  world a process joins, every world after a failure; never per step).  Rank 0
  writes a marker file holding a random nonce into its directory and
  broadcasts the marker's name; every rank reads ``<its own directory>/<name>``
  and the outcomes are allgathered; then rank 0 removes the marker.  When a
  rank does not read the nonce, EVERY rank raises the same
  :class:`SharedDirError` (one line: the directory, rank 0's host, the hosts
  that do not see it and why, how to override), so the job stops on every
  host at once instead of hanging.  Cost: two small object collectives and one
  small file written, read by each rank, and removed.
* Rank 0's setting decides.  With ``enabled=False`` on rank 0 (the directory
  is local on purpose: ``RunConfig(checkpoint_dir_shared=False)`` or
  ``HVD_ELASTIC_CHECKPOINT_LOCAL=1``) it broadcasts "off" and no rank looks
  for a marker, so ranks whose environments differ (``mpirun`` without
  ``-x``) still run the same collectives.
* A rank that does not see the marker at once looks again for ``settle``
  seconds: a network file system's attribute cache may show a new file late.
  Only a failing check waits.
* Markers are named ``.hvd-elastic-shared-<32 hex digits>``: hidden, and never
  a checkpoint's manifest, payload or temporary name, so
  :class:`~hvd_elastic.training.checkpoint.CheckpointManager` neither loads
  nor deletes them.  They do not accumulate: rank 0 removes its marker after
  the allgather, and before writing a new one removes any a killed run left
  (one job per checkpoint directory, as CheckpointManager already assumes).

Host names in messages are ``socket.gethostname()`` of the rank, followed by
Horovod's name for the host where that differs (``vm as 127.0.0.1``).

:func:`write_marker` and :meth:`Marker.seen_in` are also what ``hvd-elastic
doctor --hosts`` uses to check a directory over ssh.  This module imports
Horovod only inside its collectives, so the doctor runs where Horovod is broken.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Iterator

from hvd_elastic.envvars import horovod_hostname
from hvd_elastic.errors import HvdElasticError
from hvd_elastic.training.settings import CHECKPOINT_LOCAL_ENV as LOCAL_ENV
MARKER_PREFIX = ".hvd-elastic-shared-"
OVERRIDE = (f"pass checkpoint_dir_shared=False to hvd_elastic.run (or set {LOCAL_ENV}=1) "
            f"if the directory is local on purpose")
DEFAULT_SETTLE = 2.0  # seconds a rank keeps looking for a marker it does not see


class SharedDirError(HvdElasticError, RuntimeError):
    """The checkpoint directory is not the same directory on every rank (or rank 0 cannot prove it is)."""


@dataclasses.dataclass(frozen=True)
class Marker:
    """A marker file: its path where it was written, and the nonce it holds."""

    path: Path
    nonce: str

    @property
    def name(self) -> str:
        return self.path.name

    def seen_in(self, directory: str | os.PathLike, settle: float = 0.0) -> str | None:
        """None when ``directory`` holds this marker with its nonce; else why not (a few words).

        Looks again every 0.1 s for up to ``settle`` seconds before answering "not seen".
        """
        deadline = time.monotonic() + settle
        while True:
            reason = _read(Path(directory) / self.name, self.nonce)
            if reason is None or time.monotonic() >= deadline:
                return reason
            time.sleep(0.1)

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def is_marker(name: str) -> bool:
    return name.startswith(MARKER_PREFIX)


def write_marker(directory: str | os.PathLike) -> Marker:
    """Write a fresh marker into ``directory`` (which must exist); raises OSError."""
    nonce = secrets.token_hex(16)
    path = Path(directory) / f"{MARKER_PREFIX}{nonce}"
    # O_EXCL: a marker is never someone else's file; close() is where NFS publishes it.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, nonce.encode())
    finally:
        os.close(fd)
    return Marker(path, nonce)


def remove_markers(directory: str | os.PathLike) -> list[Path]:
    """Delete every marker in ``directory`` (left by a run killed mid-check); what was removed."""
    removed = []
    for name in os.listdir(directory):
        if is_marker(name):
            Marker(Path(directory) / name, "").remove()
            removed.append(Path(directory) / name)
    return removed


def host_label() -> str:
    """This host's name for messages: ``socket.gethostname()``, plus Horovod's name for it when that differs."""
    name = socket.gethostname()
    horovod = horovod_hostname()
    return f"{name} as {horovod}" if horovod and horovod != name else name


@contextlib.contextmanager
def announced(directory: str | os.PathLike, *, enabled: bool = True) -> Iterator[dict]:
    """Rank 0's part, around the broadcast and :func:`confirm`: a fresh marker in ``directory``
    (none when ``enabled`` is False), yielding the header every rank needs for ``confirm``; the
    marker is removed on leaving (every rank has looked for it, or the check failed)."""
    header = {"enabled": enabled, "directory": str(Path(directory).absolute()), "host": host_label()}
    marker = None
    if enabled:
        try:
            remove_markers(directory)
            marker = write_marker(directory)
            header["name"], header["nonce"] = marker.name, marker.nonce
        except OSError as exc:
            header["error"] = f"{type(exc).__name__}: {exc.strerror or exc}"
    try:
        yield header
    finally:
        if marker is not None:
            marker.remove()


def confirm(directory: str | os.PathLike, header: dict, *, settle: float = DEFAULT_SETTLE) -> int:
    """Every rank, with rank 0's header from :func:`announced`: look for the marker in this rank's
    ``directory`` and allgather who saw it (collective).

    Returns the number of ranks that saw it (0 when rank 0 turned the check off); raises
    :class:`SharedDirError` on every rank when one of them did not.
    """
    from hvd_elastic.training._internal import objects

    if not header["enabled"]:
        return 0
    if "error" in header:
        raise SharedDirError(f"checkpoint_dir {header['directory']}: rank 0 on {header['host']} cannot write "
                             f"there ({header['error']}), so it cannot check that every host sees it; "
                             f"fix the directory, or {OVERRIDE}")
    from hvd_elastic.training._internal import comm

    seen = Marker(Path(header["name"]), header["nonce"]).seen_in(directory, settle)
    reports = objects.allgather_object((comm.world()[0], host_label(), seen), name="hvd_elastic.shared_dir.seen")
    refusal = describe_refusal(header["directory"], header["host"], reports)
    if refusal:
        raise SharedDirError(refusal)
    return len(reports)


def verify(directory: str | os.PathLike, *, enabled: bool = True, settle: float = DEFAULT_SETTLE) -> int:
    """Check, collectively, that every rank's ``directory`` is rank 0's (see the module docstring):
    :func:`announced` on rank 0, its header broadcast, :func:`confirm` everywhere; what ``confirm`` returns."""
    from hvd_elastic.training._internal import comm, objects

    with announced(directory, enabled=enabled) if comm.world()[0] == 0 else contextlib.nullcontext() as header:
        header = objects.broadcast_object(header, root_rank=0, name="hvd_elastic.shared_dir.marker")
        return confirm(directory, header, settle=settle)


def describe_refusal(directory: str, rank0_host: str, reports: list[tuple[int, str, str | None]]) -> str | None:
    """The one-line refusal for ``reports`` of ``(rank, host, why not seen or None)``; None when all saw it."""
    missing: dict[str, list[int]] = {}
    reasons: dict[str, None] = {}
    for rank, host, why in sorted(reports):
        if why is not None:
            missing.setdefault(host, []).append(rank)
            reasons[why] = None
    if not missing:
        return None
    hosts = ", ".join(f"{host} (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))})"
                      for host, ranks in missing.items())
    return (f"checkpoint_dir {directory} is not shared by every host: the marker rank 0 wrote there on "
            f"{rank0_host} is not seen on {hosts} ({'; '.join(reasons)}); a restarted job whose rank 0 lands "
            f"on another host would start over from nothing. Put checkpoint_dir on storage every host mounts "
            f"at that path, or {OVERRIDE}")


def _read(path: Path, nonce: str) -> str | None:
    try:
        with open(path, "rb") as f:
            content = f.read(256)
    except FileNotFoundError:
        return "no such file"
    except OSError as exc:
        return f"unreadable: {type(exc).__name__}: {exc.strerror or exc}"
    return None if content == nonce.encode() else "a different file under the marker's name"
