"""The rendezvous state in Consul: one KV key per run, written by check-and-set on its ``ModifyIndex``.

torch's ``DynamicRendezvousHandler`` keeps the whole rendezvous (round, participants, wait list,
heartbeats) as one pickled object and runs the compare-and-swap loop itself: it reads the state, changes
it, and writes it back with the token it read; a lost race hands it the winner's state to decide again.
This backend is that read and that conditional write, as torch's etcd backend does them on etcd:

Contract:

* The key is ``<key_prefix>/<run_id>/state``; its value JSON ``{"format": 1, "state": <base64 pickle>}``;
  the fencing token is the key's ``ModifyIndex`` (an int).  ``set_state`` makes one check-and-set
  (``?cas=token``, 0 when ``token`` is None: create only) and reads the key back (Consul's answer carries
  no new index).  A write whose answer was lost counts as ours when the state read back is ours.
* Every state read is checked before torch unpickles it: a pickle that names anything but torch's
  rendezvous state classes and ``datetime`` is refused (:class:`RendezvousStateError`), so a key written
  by something else cannot run code in the agent.  Only job nodes should hold ``key_prefix`` write rights
  (docs/howto/tls-acls.md).
* Consul unreachable or failing for ``read_timeout`` seconds, or refusing (403), is a
  ``RendezvousConnectionError`` naming the key; a value that is not a state, or a state over Consul's
  512 KiB value limit (about 5,000 nodes), a ``RendezvousStateError``.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle

from torch.distributed.elastic.rendezvous import RendezvousConnectionError, RendezvousStateError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token

from hvd_elastic.consul import api
from hvd_elastic.consul.errors import ConsulError
from hvd_elastic.torchrun.settings import RendezvousSettings

FORMAT = 1
MAX_VALUE_BYTES = 512 * 1024  # Consul's limit on a KV value
_CALL_TIMEOUT_S = 10.0  # one attempt; read_timeout bounds a read's retries
_ALLOWED = {("torch.distributed.elastic.rendezvous.dynamic_rendezvous", "_RendezvousState"),
            ("torch.distributed.elastic.rendezvous.dynamic_rendezvous", "_NodeDesc"),
            ("datetime", "datetime"), ("datetime", "timezone"), ("datetime", "timedelta")}


class _StateChecker(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which is no part of a rendezvous state")
        return super().find_class(module, name)


def check_state(bits: bytes, where: str) -> bytes:
    """``bits`` when they unpickle into torch's rendezvous state and nothing else; RendezvousStateError if not."""
    try:
        _StateChecker(io.BytesIO(bits)).load()
    except Exception as exc:  # any failure to load is a corrupt state, whatever pickle raised
        raise RendezvousStateError(f"{where} holds no rendezvous state: {exc}") from None
    return bits


class ConsulRendezvousBackend(RendezvousBackend):
    def __init__(self, settings: RendezvousSettings):
        self.settings = settings
        self.key = f"{settings.run_prefix}/state"

    @property
    def name(self) -> str:
        return "consul"  # torch's registry checks it against --rdzv-backend

    def get_state(self) -> tuple[bytes, Token] | None:
        try:
            entry, _ = api.kv_entry(self.settings.consul, self.key, timeout=_CALL_TIMEOUT_S,
                                    retry_window=self.settings.read_timeout)
        except ConsulError as exc:
            raise RendezvousConnectionError(f"cannot read the rendezvous state {self.key}: {exc}") from None
        return None if entry is None else (self._decode(entry.value), entry.modify_index)

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool] | None:
        if token is not None and (not isinstance(token, int) or isinstance(token, bool)):
            current = self.get_state()  # not a token of ours: nothing to compare with, as torch's backends do
            return None if current is None else (*current, False)
        body = {"format": FORMAT, "state": base64.b64encode(state).decode()}
        if len(json.dumps(body)) > MAX_VALUE_BYTES:
            raise RendezvousStateError(f"the rendezvous state of {len(state)} bytes is over Consul's 512 KiB value "
                                       f"limit for {self.key} (too many nodes for one Consul key)")
        won: bool | None
        try:
            won = api.kv_cas(self.settings.consul, self.key, body, token or 0, timeout=_CALL_TIMEOUT_S)
        except ConsulError as exc:
            if not exc.retryable:
                raise RendezvousConnectionError(f"cannot write the rendezvous state {self.key}: {exc}") from None
            won = None  # the write may have landed: the state read back tells
        current = self.get_state()
        if current is None:
            return None
        bits, index = current
        return bits, index, (bits == state) if won is None else won

    def _decode(self, value: bytes) -> bytes:
        where = f"Consul key {self.key}"
        try:
            fields = json.loads(value)
            if not isinstance(fields, dict) or fields.get("format") != FORMAT:
                raise ValueError(f"expected a JSON object with format {FORMAT}")
            bits = base64.b64decode(fields["state"], validate=True)
        except (ValueError, KeyError, TypeError, binascii.Error) as exc:
            raise RendezvousStateError(f"{where} holds no rendezvous state: {exc}") from None
        return check_state(bits, where)
