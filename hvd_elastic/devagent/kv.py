"""The key/value store with Consul's check-and-set and session lock semantics.

Writes take the next Raft index and stamp the topics ``kvs`` (any key) and
``kv:<key>``.  Deleted keys leave a tombstone index so that a recursive read
of a prefix sees its index move when a key under it disappears.  Lock rules
follow Consul's state store: ``acquire`` succeeds for a free key (LockIndex+1)
or one the same session already holds; ``release`` only by the holder; a key
whose holding session was invalidated cannot be acquired again for the
session's lock-delay.
"""

from __future__ import annotations

import builtins  # the store has a method named list

import base64
import dataclasses
import time

from .errors import HTTPError
from .index import RaftIndex

MAX_VALUE_SIZE = 512 * 1024  # Consul's kv_max_value_size default


@dataclasses.dataclass
class Entry:
    key: str
    value: bytes
    flags: int = 0
    session: str = ""
    lock_index: int = 0
    create_index: int = 0
    modify_index: int = 0

    def to_json(self) -> dict:
        out = {
            "LockIndex": self.lock_index,
            "Key": self.key,
            "Flags": self.flags,
            "Value": base64.b64encode(self.value).decode() if self.value else None,
            "CreateIndex": self.create_index,
            "ModifyIndex": self.modify_index,
        }
        if self.session:
            out["Session"] = self.session
        return out


class KVStore:
    """All keys; every method runs on the event loop thread."""

    def __init__(self, index: RaftIndex) -> None:
        self.index = index
        self.entries: dict[str, Entry] = {}
        self._tombstones: dict[str, int] = {}
        self._lock_delay_until: dict[str, float] = {}
        self.session_exists = lambda session_id: False  # wired by Sessions

    # -- reads ------------------------------------------------------------

    def table_index(self) -> int:
        return self.index.of("kvs")

    def key_index(self, key: str) -> int:
        """What a blocking GET of one key waits on: that key's own last write."""
        entry = self.entries.get(key)
        return entry.modify_index if entry else self._tombstones.get(key, 0)

    def prefix_index(self, prefix: str) -> int:
        """What a recursive/keys read waits on: the latest write under ``prefix``."""
        best = max((e.modify_index for k, e in self.entries.items() if k.startswith(prefix)), default=0)
        tomb = max((i for k, i in self._tombstones.items() if k.startswith(prefix)), default=0)
        return max(best, tomb) or self.table_index()

    def list(self, prefix: str) -> builtins.list[Entry]:
        return [self.entries[k] for k in sorted(self.entries) if k.startswith(prefix)]

    def keys(self, prefix: str, separator: str) -> builtins.list[str]:
        out: builtins.list[str] = []
        for key in sorted(self.entries):
            if not key.startswith(prefix):
                continue
            if separator:
                cut = key.find(separator, len(prefix))
                if cut >= 0:
                    key = key[: cut + len(separator)]
            if not out or out[-1] != key:
                out.append(key)
        return out

    # -- writes -----------------------------------------------------------

    def _write(self, key: str, value: bytes, flags: int, session: str | None, lock_index: int | None) -> None:
        old = self.entries.get(key)
        session = (old.session if old else "") if session is None else session
        lock_index = (old.lock_index if old else 0) if lock_index is None else lock_index
        if (old is not None
                and (old.value, old.flags, old.session, old.lock_index) == (value, flags, session, lock_index)):
            return  # Consul skips the write (and the index bump) when nothing changes
        idx = self.index.bump("kvs", f"kv:{key}")
        self.entries[key] = Entry(
            key=key,
            value=value,
            flags=flags,
            session=session,
            lock_index=lock_index,
            create_index=old.create_index if old else idx,
            modify_index=idx,
        )

    def put(self, key: str, value: bytes, flags: int, cas: int | None = None) -> bool:
        """A plain or check-and-set write; a held lock stays held."""
        if cas is not None:
            existing = self.entries.get(key)
            if cas == 0 and existing is not None:
                return False
            if cas != 0 and (existing is None or existing.modify_index != cas):
                return False
        self._write(key, value, flags, None, None)
        return True

    def acquire(self, key: str, value: bytes, flags: int, session: str) -> bool:
        if not self.session_exists(session):
            raise HTTPError(500, f'invalid session "{session}"')
        if self._lock_delay_until.get(key, 0.0) > time.monotonic():
            return False
        existing = self.entries.get(key)
        if existing is not None and existing.session and existing.session != session:
            return False
        if existing is not None and existing.session == session:
            lock_index = existing.lock_index
        else:
            lock_index = (existing.lock_index if existing else 0) + 1
        self._write(key, value, flags, session, lock_index)
        return True

    def release(self, key: str, value: bytes, flags: int, session: str) -> bool:
        existing = self.entries.get(key)
        if existing is None or existing.session != session:
            return False
        self._write(key, value, flags, "", existing.lock_index)
        return True

    def delete(self, key: str, cas: int | None = None) -> bool:
        existing = self.entries.get(key)
        if cas is not None and (existing is None or existing.modify_index != cas):
            return existing is None
        if existing is not None:
            del self.entries[key]
            self._tombstones[key] = self.index.bump("kvs", f"kv:{key}")
        return True

    def delete_tree(self, prefix: str) -> bool:
        doomed = [k for k in self.entries if k.startswith(prefix)]
        if doomed:
            idx = self.index.bump("kvs", *(f"kv:{k}" for k in doomed))
            for key in doomed:
                del self.entries[key]
                self._tombstones[key] = idx
        return True

    def invalidate_session(self, session: str, delete: bool, lock_delay_s: float) -> None:
        """Free (or delete) every key ``session`` holds and start their lock-delay."""
        held = [e.key for e in self.entries.values() if e.session == session]
        for key in held:
            if delete:
                self.delete(key)
            else:
                entry = self.entries[key]
                self._write(key, entry.value, entry.flags, "", entry.lock_index)
            if lock_delay_s > 0:
                self._lock_delay_until[key] = time.monotonic() + lock_delay_s
