"""``create(params)``: torch's ``DynamicRendezvousHandler`` over the Consul backend and store, gated by health.

The rendezvous itself (rounds, the last call, heartbeats, the wait list a joining node enters) is torch's,
as its c10d and etcd backends use it; Consul holds the state and the agents' store.  torch reads its own
``--rdzv-conf`` keys (``join_timeout``, ``last_call_timeout``, ``close_timeout``, ``heartbeat_timeout``,
``keep_alive_interval``, ``keep_alive_max_attempt``).  Two changes to torch's handler:

* **A fresh agent store every round.**  Each round's rank 0 starts the TCPStore it hands the workers and
  publishes its address under that round's keys.  torch (2.13) does so in the first round only: a node
  joining a later round waits for an address nobody publishes (``MASTER_ADDR did not appear``), and the
  new round's workers would meet the last round's keys in the old store (torch's ``_create_c10d_store``
  assumes "a new TCPStore for every retry").
* **Health decides membership** (:mod:`.gate`).  A node whose instance is drained (``hvd-elastic drain``)
  or not passing leaves: it takes itself out of the round's participants at once, the others see a
  member gone at their next poll of ``num_nodes_waiting`` and restart their workers without counting it
  against ``--max-restarts``, and ``leave_grace`` seconds later it stops its own workers and waits, out
  of the job, until it passes again; then it joins the next round.  A member that vanishes from the
  participants any other way (torch drops a node whose heartbeats stopped) restarts the others the same
  way, before their collectives time out.

That uses private parts of torch's handler, checked at import (a torch without them fails here, in one
line).  Raises :class:`~hvd_elastic.torchrun.settings.RendezvousSettingsError` for a bad parameter.
"""

from __future__ import annotations

import datetime
import logging
import time

from torch.distributed import DistNetworkError
from torch.distributed.elastic.rendezvous import RendezvousInfo, RendezvousParameters
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dyn

from hvd_elastic.torchrun.backend import ConsulRendezvousBackend
from hvd_elastic.torchrun.gate import HealthGate
from hvd_elastic.torchrun.settings import RendezvousSettings, whole
from hvd_elastic.torchrun.store import ConsulStore

log = logging.getLogger("hvd_elastic.torchrun")
_PRIVATE = ("_bootstrap_store_info", "_state_holder", "_op_executor", "_heartbeat_lock", "_store")
if not all(name in dyn.DynamicRendezvousHandler.__init__.__code__.co_names for name in _PRIVATE) \
        or not hasattr(dyn, "_RendezvousExitOp"):
    raise ImportError(f"torchrun --rdzv-backend consul: this torch's DynamicRendezvousHandler lacks one of "
                      f"{', '.join(_PRIVATE)} or _RendezvousExitOp (written for torch 2.13); use the torch "
                      "version hvd-elastic pins")
_PARKED_LOG_S = 30.0  # how often a node kept out says why


class ConsulRendezvousHandler(dyn.DynamicRendezvousHandler):
    gate: HealthGate | None = None
    leave_grace = 0.0
    _members: frozenset = frozenset()  # the participants of the round this node is in
    _left_at: float | None = None  # when this node took itself out of its round

    def next_rendezvous(self) -> RendezvousInfo:
        self._wait_until_admitted()
        self._bootstrap_store_info = None  # a fresh agent store for every round (the module docstring says why)
        info = super().next_rendezvous()
        self._members, self._left_at = frozenset(self._state_holder.state.participants), None
        if info.rank == 0 and isinstance(self._store, ConsulStore):
            self._drop_old_rounds(self._store, self._state_holder.state.round)
        return info

    @staticmethod
    def _drop_old_rounds(store: ConsulStore, round_: int) -> None:
        # Round - 1 stays: a slow member may still read it on its way here.  Best effort: the job goes on.
        try:
            dropped = store.drop_rounds_before(round_ - 1)
        except DistNetworkError as exc:
            log.warning("could not delete the store keys of rounds before %d: %s", round_ - 1, exc)
        else:
            log.debug("deleted the store keys of %d round(s) before %d", dropped, round_ - 1)

    def num_nodes_waiting(self) -> int:
        waiting = super().num_nodes_waiting()
        if self.gate is not None and not (health := self.gate.read()).admitted:
            left_at = self._left_at if self._left_at is not None else self._leave(health.why)
            return waiting if time.monotonic() - left_at < self.leave_grace else max(waiting, 1)
        if self._left_at is None and not self._members <= set(self._state_holder.state.participants):
            return max(waiting, 1)  # a member left: a new round, before our collectives with it time out
        return waiting

    def _leave(self, why: str) -> float:
        log.warning("%s: leaving round %d of %s", why, self._state_holder.state.round, self._settings.run_id)
        with self._heartbeat_lock:
            self._op_executor.run(dyn._RendezvousExitOp(), self._deadline(self._settings.timeout.close))
        self._left_at = time.monotonic()
        return self._left_at

    def _wait_until_admitted(self) -> None:
        told = float("-inf")
        while self.gate is not None and not (health := self.gate.read()).admitted:
            if self._left_at is None:
                self._leave(health.why)
            self._state_holder.sync()
            if self._state_holder.state.closed:
                return  # the job ended while this node was out: torch's join says so
            if time.monotonic() - told >= _PARKED_LOG_S:
                log.warning("%s: this node stays out of %s until it passes", health.why, self._settings.run_id)
                told = time.monotonic()
            time.sleep(self.gate.interval)

    @staticmethod
    def _deadline(timeout: datetime.timedelta) -> float:
        return time.monotonic() + timeout.total_seconds()


def create(params: RendezvousParameters) -> ConsulRendezvousHandler:
    settings = RendezvousSettings.from_parameters(params)
    # A read of the store waits read_timeout, as c10d's TCPStore does; the exit barrier sets its own.
    store = ConsulStore(settings, datetime.timedelta(seconds=settings.read_timeout))
    timeouts = dyn.RendezvousTimeout(*(datetime.timedelta(seconds=whole(params, f"{name}_timeout", 1, minimum=1))
                                       if params.get(f"{name}_timeout") is not None else None
                                       for name in ("join", "last_call", "close", "heartbeat")))
    handler = ConsulRendezvousHandler.from_backend(
        params.run_id, store, ConsulRendezvousBackend(settings), params.min_nodes, params.max_nodes,
        params.local_addr, timeouts, keep_alive_interval=whole(params, "keep_alive_interval", 5, minimum=1),
        keep_alive_max_attempt=whole(params, "keep_alive_max_attempt", 3, minimum=1, unit="attempts"))
    if settings.health_gate != "false":
        handler.gate = HealthGate(settings.consul, settings.service, required=settings.health_gate == "true")
        handler.leave_grace = settings.leave_grace
    return handler
