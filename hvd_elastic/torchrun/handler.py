"""``create(params)``: torch's ``DynamicRendezvousHandler`` over the Consul backend and store.

The rendezvous itself (rounds, the last call, heartbeats, the wait list a joining node enters) is torch's,
as its c10d and etcd backends use it; Consul holds the state and the agents' store.  torch reads its own
``--rdzv-conf`` keys (``join_timeout``, ``last_call_timeout``, ``close_timeout``, ``heartbeat_timeout``,
``keep_alive_interval``, ``keep_alive_max_attempt``).

One change to torch's handler: each round starts afresh the agent store it hands the workers (a TCPStore
on rank 0's agent, whose address rank 0 publishes under the round's keys).  torch (2.13) builds it in the
first round only and keeps it: a node joining a later round then waits for an address nobody publishes
(``MASTER_ADDR did not appear``), a rank whose rank 0 changed keeps the old one's, and the new round's
workers meet the last round's keys in the old store ("we create a new TCPStore for every retry", as
torch's ``_create_c10d_store`` assumes).  That is one private attribute of torch's handler, checked at
import (a torch without it fails here, in one line).

Raises :class:`~hvd_elastic.torchrun.settings.RendezvousSettingsError` for a bad parameter.
"""

from __future__ import annotations

import datetime

from torch.distributed.elastic.rendezvous import RendezvousInfo, RendezvousParameters
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, RendezvousTimeout

from hvd_elastic.torchrun.backend import ConsulRendezvousBackend
from hvd_elastic.torchrun.settings import RendezvousSettings, RendezvousSettingsError
from hvd_elastic.torchrun.store import ConsulStore

_PRIVATE = "_bootstrap_store_info"
if _PRIVATE not in DynamicRendezvousHandler.__init__.__code__.co_names:
    raise ImportError(f"torchrun --rdzv-backend consul: this torch's DynamicRendezvousHandler has no {_PRIVATE} "
                      "(written for torch 2.13); use the torch version hvd-elastic pins")


class ConsulRendezvousHandler(DynamicRendezvousHandler):
    def next_rendezvous(self) -> RendezvousInfo:
        self._bootstrap_store_info = None  # a fresh agent store for every round (the module docstring says why)
        return super().next_rendezvous()


def create(params: RendezvousParameters) -> ConsulRendezvousHandler:
    settings = RendezvousSettings.from_parameters(params)
    # A read of the store waits read_timeout, as c10d's TCPStore does; the exit barrier sets its own.
    store = ConsulStore(settings, datetime.timedelta(seconds=settings.read_timeout))
    timeouts = RendezvousTimeout(*(_seconds(params, f"{name}_timeout")
                                   for name in ("join", "last_call", "close", "heartbeat")))
    return ConsulRendezvousHandler.from_backend(
        params.run_id, store, ConsulRendezvousBackend(settings), params.min_nodes, params.max_nodes,
        params.local_addr, timeouts, keep_alive_interval=_int(params, "keep_alive_interval", 5),
        keep_alive_max_attempt=_int(params, "keep_alive_max_attempt", 3))


def _int(params: RendezvousParameters, key: str, default: int) -> int:
    try:
        value = params.get_as_int(key, default)
    except ValueError:
        value = None
    if value is None or value <= 0:
        raise RendezvousSettingsError(f"--rdzv-conf {key}={params.get(key)!r} is not a whole number above 0")
    return value


def _seconds(params: RendezvousParameters, key: str) -> datetime.timedelta | None:
    return datetime.timedelta(seconds=_int(params, key, 1)) if params.get(key) is not None else None
