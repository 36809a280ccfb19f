"""``ConsulStore``: the ``torch.distributed.Store`` torch's elastic agents bootstrap from, on Consul KV.

A rendezvous hands its agents a store (torch prefixes the keys with the run and the round): rank 0 of a
round publishes its ``MASTER_ADDR`` and port there, every agent its workers' ranks, and the exit barrier
counts there.  With torch's c10d backend that store is a TCPStore on one host, which must outlive the
job; here it is Consul, which the job already trusts for its state.  The workers' own store is torch's
(a TCPStore rank 0's agent starts each round).

Contract:

* A key ``k`` is ``<key_prefix>/<run_id>/store/<base64url(k)>``; its value JSON ``{"v": <base64>}``.  A key
  of a rendezvous round (torch prefixes them ``torch.rendezvous.<run_id>.<round>/``) lies under the round's
  own folder, ``.../store/round-<round>/<base64url(rest)>``, so :meth:`ConsulStore.drop_rounds_before`
  deletes a finished round's keys in one recursive delete each.
* ``get`` and ``wait`` block (Consul blocking queries) until every key exists, for the store's timeout
  (torch's ``set_timeout``; ``read_timeout`` at first), then raise ``DistStoreError`` naming the key.  ``add`` is a
  check-and-set loop, atomic across agents.  ``check`` does not wait.
* Consul unreachable or failing for ``read_timeout`` seconds, or refusing (403): ``DistNetworkError``.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import re
import time
import uuid
from collections.abc import Sequence

import torch.distributed as dist

from hvd_elastic.consul import api
from hvd_elastic.consul.errors import ConsulError
from hvd_elastic.torchrun.settings import RendezvousSettings

_BLOCK_S = 30.0  # one blocking read; a longer wait is several
_CALL_MARGIN_S = 10.0  # beyond the blocking wait, for the answer to arrive
_ROUND_KEY = re.compile(rb"torch\.rendezvous\.[^/]*\.(\d+)/(.+)", re.DOTALL)  # torch's PrefixStore of a round


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


class ConsulStore(dist.Store):
    def __init__(self, settings: RendezvousSettings, timeout: datetime.timedelta | None = None):
        super().__init__()  # the pybind trampoline needs it
        self.settings = settings
        self.prefix = f"{settings.run_prefix}/store/"
        if timeout is not None:
            self.set_timeout(timeout)

    def set(self, key: str, value: str | bytes) -> None:
        try:
            api.kv_put(self.settings.consul, self._key(key), self._value(_bytes(value)), timeout=_CALL_MARGIN_S,
                       retry_window=self.settings.read_timeout)
        except ConsulError as exc:
            raise self._unreachable(key, exc) from None

    def get(self, key: str) -> bytes:
        return self._wait_for(key, time.monotonic() + self._timeout().total_seconds())

    def add(self, key: str, num: int) -> int:
        while True:
            entry = self._read(key)
            value = (int(self._decode(key, entry)) if entry else 0) + num
            body = self._value(str(value).encode())
            try:
                if api.kv_cas(self.settings.consul, self._key(key), body, entry.modify_index if entry else 0,
                              timeout=_CALL_MARGIN_S):
                    return value
            except ConsulError as exc:
                if not exc.retryable:
                    raise self._unreachable(key, exc) from None
                if self._written_by(self._read(key), body["by"]):  # the answer was lost, not necessarily the write
                    return value

    def check(self, keys: Sequence[str]) -> bool:
        return all(self._read(key) is not None for key in keys)

    def wait(self, keys: Sequence[str], timeout: datetime.timedelta | None = None) -> None:
        deadline = time.monotonic() + (timeout or self._timeout()).total_seconds()
        for key in keys:
            self._wait_for(key, deadline)

    def _timeout(self) -> datetime.timedelta:
        return self.timeout  # type: ignore[attr-defined]  # torch's Store property, missing from its stubs

    def drop_rounds_before(self, round_: int) -> int:
        """Delete the keys of every round before ``round_``; returns how many rounds had keys.  Raises
        ``DistNetworkError``."""
        try:
            folders = api.kv_keys(self.settings.consul, self.prefix, "/", timeout=_CALL_MARGIN_S)
            old = [folder for folder in folders
                   if (found := re.fullmatch(re.escape(self.prefix) + r"round-(\d+)/", folder))
                   and int(found[1]) < round_]
            for folder in old:
                api.kv_delete(self.settings.consul, folder, timeout=_CALL_MARGIN_S, recurse=True)
        except ConsulError as exc:
            raise dist.DistNetworkError(f"Consul store {self.prefix}: cannot drop rounds before {round_}: "
                                        f"{exc}") from None
        return len(old)

    def _key(self, key: str | bytes) -> str:
        raw = _bytes(key)
        if found := _ROUND_KEY.fullmatch(raw):
            return f"{self.prefix}round-{int(found[1])}/{_b64(found[2])}"
        return self.prefix + _b64(raw)

    @staticmethod
    def _value(value: bytes) -> dict:
        return {"v": base64.b64encode(value).decode(), "by": uuid.uuid4().hex}

    def _read(self, key: str) -> api.KVEntry | None:
        return self._read_at(key, 0, 0.0)[0]

    def _read_at(self, key: str, index: int, wait: float) -> tuple[api.KVEntry | None, int]:
        try:
            return api.kv_entry(self.settings.consul, self._key(key), index=index, wait=wait,
                                timeout=wait + _CALL_MARGIN_S, retry_window=self.settings.read_timeout)
        except ConsulError as exc:
            raise self._unreachable(key, exc) from None

    def _wait_for(self, key: str, deadline: float) -> bytes:
        index = 0
        while True:
            left = deadline - time.monotonic()
            entry, index = self._read_at(key, index, min(max(left, 0.0), _BLOCK_S))
            if entry is not None:
                return self._decode(key, entry)
            if left <= 0:
                raise dist.DistStoreError(f"key {key!r} did not appear in the Consul store {self.prefix} within "
                                          f"{self._timeout().total_seconds():g} s")
            if index <= 0:  # nothing to block on: a short pause instead of a busy loop
                time.sleep(min(0.1, left))

    @staticmethod
    def _written_by(entry: api.KVEntry | None, nonce: str) -> bool:
        try:
            return entry is not None and json.loads(entry.value).get("by") == nonce
        except (ValueError, AttributeError):
            return False

    def _decode(self, key: str, entry: api.KVEntry) -> bytes:
        try:
            return base64.b64decode(json.loads(entry.value)["v"], validate=True)
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise dist.DistStoreError(f"key {key!r} of the Consul store {self.prefix} holds no store value") from None

    def _unreachable(self, key: str, exc: ConsulError) -> dist.DistNetworkError:
        return dist.DistNetworkError(f"Consul store {self.prefix}, key {key!r}: {exc}")
