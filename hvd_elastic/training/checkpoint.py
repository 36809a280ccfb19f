"""Durable checkpoints of the committed training state.

A checkpoint is a pair of files in one directory::

    ckpt-00000007-1a2b3c4d.pt      the payload: torch.save({"format", "version", "snapshot"})
    ckpt-00000007.json             the manifest: sequence number, step, epoch, commit count,
                                   time, world size, format version, payload name, size, sha256

The manifest is the commit marker: it is renamed into place only after the payload
is durable, and it names the exact payload (a random suffix keeps two writers from
ever pairing a manifest with someone else's payload).  Each file is written to a
temporary name in the same directory, fsynced, renamed, and the directory is
fsynced, so a crash at any instant leaves either the previous checkpoints or the
new one, never a torn file under a final name.

Contracts:

* Training never waits for serialisation, hashing or I/O: they happen in one
  background thread, from a private copy of the snapshot in staging buffers that
  are reused from one checkpoint to the next.  The copy is taken on the commit
  path (:meth:`CheckpointManager.commit`), or, when the manager is given the
  committer's ``lock``, by the writer thread while holding that lock, so the
  commit path only hands over and the next commit waits only if it comes before
  the copy is done.  At most one write is in flight: a checkpoint that falls due
  while the writer is busy is taken at the first commit after it is idle again.
* A write error never raises into training.  It is logged, reported to the
  ``on_event`` callback as ``checkpoint_error``, the temporary file is removed
  and the existing checkpoints are kept.
* A snapshot holding a value ``torch.load(weights_only=True)`` cannot read is
  a write error naming the value and its type (see
  :func:`hvd_elastic.training._internal.snapshot.check_loadable`): nothing is written
  that would only fail at resume.  :class:`~hvd_elastic.training.state.TrainingState`
  refuses such a value where it is stored, so its snapshots never reach this.
* :meth:`CheckpointManager.load_latest` returns the newest checkpoint whose
  manifest parses and whose payload matches its sha256; anything else is skipped
  with a warning that names the file.  When checkpoints exist and NONE loads it
  raises :class:`UnreadableCheckpoints` listing each file and why, unless asked
  for a fresh start.  Payloads are hashed while streamed from disk, then loaded
  from the file (memory-mapped) with ``torch.load(weights_only=True)`` only, so
  a checkpoint can never run code and resuming never holds it twice in RAM.
  Files under final names are never rewritten (each write goes to a temporary
  name and is renamed), so the bytes hashed are the bytes loaded.

Fault injection: ``HVD_ELASTIC_CHECKPOINT_WRITE_DELAY`` (seconds, float) makes
the writer sleep after the payload's bytes are in the temporary file and before
it is made durable, so tests can kill a job in the middle of a write.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import io
import json
import logging
import os
import re
import secrets
import threading
import time
from pathlib import Path
from typing import IO, Any, Callable, Mapping, cast

import torch

from hvd_elastic.errors import HvdElasticError
from hvd_elastic.training._internal.snapshot import check_loadable
from hvd_elastic.training.events import describe_error

log = logging.getLogger(__name__)

FORMAT = "hvd-elastic-checkpoint"
FORMAT_VERSION = 1
WRITE_DELAY_ENV = "HVD_ELASTIC_CHECKPOINT_WRITE_DELAY"

_MANIFEST_RE = re.compile(r"^ckpt-(\d{8,})\.json$")
_PAYLOAD_RE = re.compile(r"^ckpt-(\d{8,})-[0-9a-f]{8}\.pt$")
_TEMP_PREFIX = ".tmp-"
_HASH_CHUNK = 1 << 20

EventCallback = Callable[[str, dict], None]


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A checkpoint read back from disk: its snapshot, manifest and files."""

    snapshot: Any
    manifest: dict
    manifest_path: Path
    payload_path: Path


class CheckpointManager:
    """Writes committed snapshots to ``directory`` and reads the newest valid one back.

    Args:
        directory: where checkpoints live; created if missing (ValueError naming it when a file is in the way).
        every_commits: write at every N-th call of :meth:`commit` (None: never by count).
        every_seconds: write at the first commit at least T seconds after the last
            write (None: never by time).  Time is only checked at commits, because a
            commit is the only moment a consistent snapshot exists.
        keep_last: how many checkpoints to keep; older ones are deleted after each
            successful write.
        on_event: called as ``on_event(name, fields)`` for ``checkpoint``,
            ``checkpoint_error`` and ``checkpoint_skipped``; may be called from the
            writer thread.
        lock: the lock the committer holds while it overwrites the committed
            snapshot (``TrainingState.snapshot_lock``).  With it, snapshots passed
            as callables are called and copied in the writer thread under the lock.
        describe: ``describe(snapshot) -> dict`` of manifest fields read from the
            copied snapshot itself (they override ``meta``), so the manifest matches
            the payload even when the background copy caught a later commit.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        every_commits: int | None = None,
        every_seconds: float | None = None,
        keep_last: int = 3,
        on_event: EventCallback | None = None,
        lock: Any = None,
        describe: Callable[[Any], dict] | None = None,
    ) -> None:
        check_policy(every_commits, every_seconds, keep_last)
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):  # mkdir's errors name neither the setting nor the culprit
            raise ValueError(f"checkpoint_dir={str(directory)!r} cannot be made a directory: "
                             f"{_file_in_the_way(self.directory)} is a file (expected a directory, or a path where "
                             "one can be made)") from None
        self.every_commits = every_commits
        self.every_seconds = every_seconds
        self.keep_last = keep_last
        self._on_event = on_event
        self._lock = lock
        self._describe = describe

        self._commits_since_write = 0
        self._last_write_started = time.monotonic()
        self._staging: Any = None
        self.last_error: BaseException | None = None

        # One pending job at most; the writer thread starts on the first write.
        self._cond = threading.Condition()
        self._pending: tuple[Any, dict] | None = None
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ writing

    def commit(self, snapshot: Any | Callable[[], Any], **meta: Any) -> bool:
        """Count one commit and start a background write if a checkpoint is due.

        ``snapshot`` is the committed state (or a callable returning it, called only
        when a write starts).  Without a ``lock`` it is copied into staging buffers
        before this returns, so the caller may overwrite it afterwards.  ``meta``
        (step, epoch, commit_count, world_size, ...) goes into the manifest.  Call
        from the committing thread.  Returns True when a write was started.
        """
        self._commits_since_write += 1
        if not self._due():
            return False
        with self._cond:
            if self._closed or self._busy or self._pending is not None:
                return False  # taken at the first commit after the writer is idle
        self._submit(snapshot, meta)
        return True

    def save(self, snapshot: Any | Callable[[], Any], *, wait: bool = True, **meta: Any) -> bool:
        """Write a checkpoint now (after any write in flight).  Returns True on success
        when ``wait``; otherwise True once the write is queued."""
        self.flush()
        if self._closed:
            return False
        self._submit(snapshot, meta)
        if wait:
            self.flush()
            return self.last_error is None
        return True

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until no write is pending or in flight; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending is None and not self._busy, timeout)

    def close(self) -> None:
        """Finish the write in flight, then stop the writer thread.  Idempotent."""
        with self._cond:
            if self._closed:
                return
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        atexit.unregister(self.close)

    def _due(self) -> bool:
        if self.every_commits is not None and self._commits_since_write >= self.every_commits:
            return True
        if self.every_seconds is not None and time.monotonic() - self._last_write_started >= self.every_seconds:
            return True
        return False

    def _submit(self, snapshot: Any, meta: dict) -> None:
        if self._lock is None:
            # The writer is idle here, so the staging buffers are free to overwrite.
            self._staging = _stage(snapshot() if callable(snapshot) else snapshot, self._staging)
            snapshot = self._staging
        elif not callable(snapshot):
            raise TypeError("with a lock, pass the snapshot as a callable, so it is read under the lock")
        self._commits_since_write = 0
        self._last_write_started = time.monotonic()
        with self._cond:
            self._pending = (snapshot, dict(meta))
            if self._thread is None:
                self._thread = threading.Thread(target=self._writer_loop, name="hvd-elastic-checkpoint", daemon=True)
                self._thread.start()
                atexit.register(self.close)  # an interpreter exit finishes the write in flight
            self._cond.notify_all()

    def _writer_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closed)
                if self._pending is None:
                    return
                snapshot, meta = self._pending
                self._pending = None
                self._busy = True
            try:
                self._write(snapshot, meta)
            except Exception:  # noqa: BLE001 -- keep the writer alive for the next checkpoint
                log.exception("checkpoint writer failed")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _write(self, snapshot: Any, meta: dict) -> None:
        started = time.monotonic()
        payload_name = "ckpt-?.pt"
        temps: list[Path] = []
        try:
            if self._lock is not None:
                with self._lock:
                    self._staging = snapshot = _stage(snapshot(), self._staging)
            check_loadable(snapshot, "snapshot")
            if self._describe is not None:
                meta = {**meta, **self._describe(snapshot)}
            seq = self._next_sequence()
            payload_name = f"ckpt-{seq:08d}-{secrets.token_hex(4)}.pt"
            manifest_name = f"ckpt-{seq:08d}.json"
            payload_tmp = self._temp_path(payload_name)
            temps.append(payload_tmp)
            digest, size = self._write_payload(payload_tmp, snapshot)
            os.replace(payload_tmp, self.directory / payload_name)
            temps.remove(payload_tmp)
            manifest = {
                "format": FORMAT,
                "format_version": FORMAT_VERSION,
                "sequence": seq,
                "time": time.time(),
                **{k: v for k, v in meta.items() if _is_json_scalar(v)},
                "payload": payload_name,
                "bytes": size,
                "sha256": digest,
            }
            manifest_tmp = self._temp_path(manifest_name)
            temps.append(manifest_tmp)
            with open(manifest_tmp, "w", encoding="utf-8") as f:
                json.dump(manifest, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(manifest_tmp, self.directory / manifest_name)
            temps.remove(manifest_tmp)
            _fsync_dir(self.directory)
        except Exception as exc:  # noqa: BLE001 -- must never escape into training
            for tmp in temps:
                _unlink_quietly(tmp)
            self.last_error = exc
            log.error("checkpoint write %s failed, keeping the previous checkpoints: %s", payload_name, exc)
            self._emit("checkpoint_error", {"path": str(self.directory / payload_name), "error": describe_error(exc)})
            return
        self.last_error = None
        seconds = time.monotonic() - started
        self._emit(
            "checkpoint",
            {"path": str(self.directory / manifest_name), "payload": payload_name, "bytes": size,
             "seconds": round(seconds, 6), **{k: v for k, v in meta.items() if _is_json_scalar(v)}},
        )
        self._rotate()

    def _write_payload(self, path: Path, snapshot: Any) -> tuple[str, int]:
        hasher = _HashingWriter(open(path, "xb"))
        with hasher.file:
            # torch's stub wants a full IO[bytes]; on a buffer torch.save only calls write() and flush()
            torch.save({"format": FORMAT, "version": FORMAT_VERSION, "snapshot": snapshot}, cast(IO[bytes], hasher))
            delay = float(os.environ.get(WRITE_DELAY_ENV, "0") or 0)
            if delay > 0:
                hasher.file.flush()
                time.sleep(delay)
            hasher.file.flush()
            os.fsync(hasher.file.fileno())
        return hasher.sha256.hexdigest(), hasher.size

    def _temp_path(self, final_name: str) -> Path:
        return self.directory / f"{_TEMP_PREFIX}{final_name}.{os.getpid()}"

    def _next_sequence(self) -> int:
        seqs = [seq for seq, _ in self._manifests()]
        seqs += [int(m.group(1)) for name in os.listdir(self.directory) if (m := _PAYLOAD_RE.match(name))]
        return max(seqs, default=0) + 1

    def _rotate(self) -> None:
        for _, manifest_path in self._manifests()[self.keep_last:]:
            payload = _payload_name(manifest_path)
            _unlink_quietly(manifest_path)
            if payload:
                _unlink_quietly(self.directory / payload)
        _fsync_dir(self.directory)

    def _emit(self, name: str, fields: dict) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(name, fields)
        except Exception:  # noqa: BLE001 -- a broken listener must not stop checkpointing
            log.exception("checkpoint event listener failed on %s", name)

    # ------------------------------------------------------------------ reading

    def _manifests(self) -> list[tuple[int, Path]]:
        """(sequence, manifest path), newest first."""
        found = [(int(m.group(1)), self.directory / name)
                 for name in os.listdir(self.directory) if (m := _MANIFEST_RE.match(name))]
        return sorted(found, reverse=True)

    def checkpoints(self) -> list[Path]:
        """Manifest paths present in the directory, newest first (not validated)."""
        return [path for _, path in self._manifests()]

    def load_latest(self, *, fresh_start_if_unreadable: bool = False) -> Checkpoint | None:
        """The newest valid checkpoint, or None if the directory holds none.

        Invalid ones (unreadable manifest, missing payload, checksum mismatch, a
        payload ``weights_only`` refuses) are skipped with a warning naming the file.
        When there are checkpoints and none is valid, raises
        :class:`UnreadableCheckpoints` (one line: each file and why), unless
        ``fresh_start_if_unreadable`` (then None: training starts from scratch).
        """
        refused: list[_Invalid] = []
        for _, manifest_path in self._manifests():
            try:
                return self._load(manifest_path)
            except _Invalid as exc:
                refused.append(exc)
                log.warning("skipping checkpoint %s: %s", exc.path, exc.reason)
                self._emit("checkpoint_skipped", {"path": str(exc.path), "reason": exc.reason})
        if refused and not fresh_start_if_unreadable:
            raise UnreadableCheckpoints(self.directory, refused)
        return None

    def _load(self, manifest_path: Path) -> Checkpoint:
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise _Invalid(manifest_path, f"unreadable manifest ({exc})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise _Invalid(manifest_path, f"not a {FORMAT} manifest")
        if manifest.get("format_version") != FORMAT_VERSION:
            raise _Invalid(manifest_path, f"format version {manifest.get('format_version')!r}, "
                                          f"this version reads {FORMAT_VERSION}")
        payload_name = manifest.get("payload")
        if not isinstance(payload_name, str) or not _PAYLOAD_RE.match(payload_name):
            raise _Invalid(manifest_path, f"bad payload name {payload_name!r}")
        payload_path = self.directory / payload_name
        try:
            digest, size = _sha256_of(payload_path)
        except OSError as exc:
            raise _Invalid(payload_path, f"unreadable payload ({exc.strerror or exc})") from None
        if digest != manifest.get("sha256") or size != manifest.get("bytes"):
            raise _Invalid(payload_path, f"checksum mismatch ({size} bytes, sha256 {digest[:12]}..., "
                                         f"manifest says {manifest.get('bytes')} bytes, "
                                         f"sha256 {str(manifest.get('sha256'))[:12]}...)")
        try:
            # mmap: tensors are read from the page cache as they are copied into
            # the live objects, never as a second in-memory copy of the file.
            payload = torch.load(payload_path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:  # noqa: BLE001 -- weights_only refusals and corrupt zips alike
            raise _Invalid(payload_path, f"torch.load(weights_only=True) refused it: {describe_error(exc)}") from None
        if not isinstance(payload, dict) or payload.get("format") != FORMAT or "snapshot" not in payload:
            raise _Invalid(payload_path, f"not a {FORMAT} payload")
        return Checkpoint(payload["snapshot"], manifest, manifest_path, payload_path)

    def remove_stale(self) -> list[Path]:
        """Delete temporary files and payloads without a manifest, left by a writer
        that died mid-write.  Call only when no other process writes here (at job
        start).  Returns what was removed."""
        referenced = {_payload_name(path) for _, path in self._manifests()}
        removed = []
        for name in os.listdir(self.directory):
            if name.startswith(_TEMP_PREFIX) or (_PAYLOAD_RE.match(name) and name not in referenced):
                log.warning("removing %s, left by an interrupted checkpoint write", self.directory / name)
                _unlink_quietly(self.directory / name)
                removed.append(self.directory / name)
        return removed


def check_policy(every_commits: int | None, every_seconds: float | None, keep_last: int) -> None:
    """Raise ValueError naming the first bad checkpoint setting."""
    if every_commits is not None and (not isinstance(every_commits, int) or every_commits < 1):
        raise ValueError(f"every_commits must be a positive integer or None, got {every_commits!r}")
    if every_seconds is not None and not (isinstance(every_seconds, (int, float)) and every_seconds > 0):
        raise ValueError(f"every_seconds must be a positive number of seconds or None, got {every_seconds!r}")
    if not isinstance(keep_last, int) or keep_last < 1:
        raise ValueError(f"keep_last must be a positive integer, got {keep_last!r}")


def _file_in_the_way(directory: Path) -> str:
    """The path itself or the first of its parents that exists and is no directory."""
    for path in (*reversed(directory.parents), directory):
        if path.exists() and not path.is_dir():
            return repr(str(path))
    return "a part of its path"


class UnreadableCheckpoints(HvdElasticError, RuntimeError):
    """A checkpoint directory holds checkpoints and none of them loads."""

    def __init__(self, directory: Path, refused: list["_Invalid"]) -> None:
        reasons = "; ".join(f"{exc.path.name}: {exc.reason}" for exc in refused).replace("\n", " ")
        super().__init__(
            f"{directory} holds {len(refused)} checkpoint(s) and none loads ({reasons}): fix or remove them, "
            f"or pass fresh_start_if_unreadable=True to start from step 0"
        )
        self.directory = directory
        self.refused = refused


class _Invalid(Exception):
    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class _HashingWriter:
    """A write-only file object that hashes what passes through it."""

    def __init__(self, file: io.BufferedWriter) -> None:
        self.file = file
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data) -> int:
        self.sha256.update(data)
        self.size += memoryview(data).nbytes
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


def _stage(src: Any, prev: Any) -> Any:
    """A private copy of ``src`` that reuses ``prev``'s tensors where shapes match,
    so a periodic checkpoint costs one memcpy and no allocation on the commit path."""
    if isinstance(src, torch.Tensor):
        if (isinstance(prev, torch.Tensor) and prev.shape == src.shape and prev.dtype == src.dtype
                and prev.device.type == "cpu" and prev.layout == src.layout == torch.strided):
            return prev.copy_(src)
        return src.detach().to("cpu", copy=True).contiguous() if src.layout == torch.strided else src.clone()
    if isinstance(src, Mapping):
        prev_map = prev if isinstance(prev, Mapping) else {}
        cls = type(src) if isinstance(src, dict) else dict  # keeps OrderedDict, which state_dicts use
        return cls((k, _stage(v, prev_map.get(k))) for k, v in src.items())
    if isinstance(src, (list, tuple)):
        prev_seq = prev if isinstance(prev, (list, tuple)) and len(prev) == len(src) else [None] * len(src)
        items = [_stage(v, p) for v, p in zip(src, prev_seq)]
        return items if isinstance(src, list) else tuple(items)
    return src  # immutable scalars and strings


def _sha256_of(path: Path) -> tuple[str, int]:
    """sha256 hex digest and size of a file, streamed through one reused buffer."""
    hasher, size = hashlib.sha256(), 0
    chunk = memoryview(bytearray(_HASH_CHUNK))
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(chunk):
            hasher.update(chunk[:n])
            size += n
    return hasher.hexdigest(), size


def _payload_name(manifest_path: Path) -> str | None:
    try:
        name = json.loads(manifest_path.read_text(encoding="utf-8")).get("payload")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) and _PAYLOAD_RE.match(name) else None


def _is_json_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc)

