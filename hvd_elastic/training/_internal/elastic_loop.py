"""Horovod's elastic retry loop, with the sync decision agreed by every rank.

``hvd.elastic.run`` (``horovod/common/elastic.py: run_fn``) skips the state's sync
after a reset when the interrupt said "hosts were only removed" (``skip_sync``).
That decision is taken BEFORE the reset's rendezvous, and the rendezvous may
bring in a host that arrived meanwhile (a drain that took the world below
``--min-np``, followed by a new host: Horovod #3494's setting).  The survivors
then skip the sync and start training, while the new process, whose first act
is always a sync, waits in its broadcast: the job deadlocks, each side in a
different collective.

:func:`run_elastic` is the same loop, except that after every reset all ranks
agree, with one tiny allgather, whether ANY of them needs the sync (a new
process always does; after a failure everyone does).  That allgather is the
first collective of every world, on every rank, so it always matches.

The caller may run its own collective step right before every sync
(``before_sync``): the runner checks there that every rank sees the
checkpoint directory (:mod:`.shared_dir`), so a process that joins is
checked in the world it joins.

A rank whose Horovod failed also hangs up its Gloo connections before the
reset (:mod:`.gloo_hangup`), so a peer waiting on it fails now instead of
after the Gloo timeout; and in the first world of two or more ranks it checks
that Gloo's loop is found at all (one warning per run if not).

The same allgather carries each rank's host name, so the first rank of each
host knows which hosts its collectives wait on, and hangs up when Consul
judges one of them lost (:mod:`.health_cut`).

A :class:`.join_ahead.JoinInterrupt` (hosts added, the newcomers already
waiting) carries this rank's place in the next world, which its
re-initialisation takes from it instead of asking the driver again.

Each reset enters ``hvd.init()`` only once the new world can form
(:func:`.rendezvous.next_world`): a host lost meanwhile sends the survivors on
to the next world with their state, where Gloo would have aborted them after
its timeout; one lost while they connect ends them soon after the driver gives
the world up (:func:`.rendezvous.leave_if_doomed`), not after that timeout.
The new world's hosts then go to the health cut before its first
collective, so a host lost during the sync is cut too.

The loop itself reads like Horovod's; these additions sit in
:class:`_Additions`, one method per moment of it.
"""

from __future__ import annotations

import logging
import os
from typing import Callable

import horovod.torch as hvd
from hvd_elastic.envvars import horovod_hostname
from hvd_elastic.training._internal import gloo_hangup, health_cut, join_ahead, objects, rendezvous
from hvd_elastic.training._internal.compat import notification_manager
from hvd_elastic.training.settings import WorkerSettings
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

log = logging.getLogger(__name__)


def _new_world(needs_sync: bool) -> tuple[bool, list[str]]:
    """The first collective of every world: whether any rank needs the sync, and every rank's host name
    (by rank)."""
    ranks = objects.allgather_object((needs_sync, horovod_hostname()), name="hvd_elastic.world")
    return any(needs for needs, _ in ranks), [host for _, host in ranks]


def _reset(answer: str | None, gloo_timeout: float) -> tuple[str, ...]:
    """What horovod.torch.elastic does between worlds: leave the old one, rendezvous anew.  Returns the new
    world's hosts by rank when the driver told them (else empty)."""
    try:
        local_rank = hvd.local_rank()  # the slot the driver knows this process by, as join_ahead asks
    except ValueError:
        local_rank = int(os.environ.get("HOROVOD_LOCAL_RANK", "0"))
    hvd.shutdown()
    hosts: tuple[str, ...] = ()
    server = rendezvous.Server.from_env()
    try:
        if server is not None and server.world() is not None:
            answer, hosts = rendezvous.next_world(server, horovod_hostname(), local_rank,
                                                  answer, gloo_timeout)
    except rendezvous.ERRORS as exc:
        log.warning("the driver's rendezvous server failed a request (%s): re-initialising as Horovod does", exc)
    with rendezvous.leave_if_doomed(server):
        if answer is None:
            hvd.init()
        else:
            with rendezvous.answered_init(answer):
                hvd.init()
    return hosts


class _Additions:
    """hvd-elastic's additions to Horovod's loop, one method per moment of it (module docstring)."""

    def __init__(self, before_sync: Callable[[], None] | None, settings: WorkerSettings):
        self._hang_up = settings.gloo_hangup
        self._loop_check_due = settings.gloo_hangup
        self._before_sync = before_sync
        self._cut = health_cut.start(settings)

    def world_formed(self, hosts: list[str]) -> None:
        """After the world's first collective: the hosts the cut watches; in the first world of two or
        more ranks, whether Gloo's loop is found (every Gloo pair is up by now)."""
        if hvd.size() < 2:
            return
        if self._cut is not None:
            self._cut.set_world(hosts)
        if self._loop_check_due:
            self._loop_check_due = False
            if hvd.gloo_enabled():
                gloo_hangup.check_found()

    def before_sync(self) -> None:
        if self._before_sync is not None:
            self._before_sync()

    def failed(self) -> None:
        """Horovod failed on this rank: hang up first, so a peer blocked on this rank learns of it now."""
        if self._hang_up:
            gloo_hangup.hang_up_if_stalled()

    def between_worlds(self) -> None:
        if self._cut is not None:
            self._cut.between_worlds()

    def reinitialised(self, hosts: tuple[str, ...]) -> None:
        """The new world's hosts as the driver told them: cut before the first collective, so a host
        lost during the sync is cut too."""
        if self._cut is not None and len(hosts) > 1:
            self._cut.set_world(hosts)

    def close(self) -> None:
        if self._cut is not None:
            self._cut.stop()


def run_elastic(fn, state, *args, settings: WorkerSettings, before_sync: Callable[[], None] | None = None,
                **kwargs):
    """Call ``fn(state, *args, **kwargs)`` until it returns, recovering from resets like ``hvd.elastic.run``.

    On ``HorovodInternalError`` this rank's Gloo connections are hung up, then
    the state is restored to its last commit; on ``HostsUpdatedInterrupt``
    nothing is hung up (the context is sound, every rank leaves it together)
    and the state is kept.  Then Horovod is re-initialised (the new
    world's rendezvous), ``state.on_reset()`` runs, and the state is synced from
    rank 0 unless every rank of the new world agrees it may be skipped.
    ``before_sync()`` runs on every rank right before each sync, in the same
    world (so it may use collectives); an error it raises that is not
    Horovod's ends the loop.  ``settings``: the worker's switches (the hang-up, the health cut).
    """
    gloo_timeout = rendezvous.gloo_timeout()  # a bad HOROVOD_GLOO_TIMEOUT_SECONDS is an error now too
    additions = _Additions(before_sync, settings)
    notification_manager.init()
    notification_manager.register_listener(state)
    skip_sync, answer = False, None  # this process has never synced: it needs rank 0's state
    try:
        with join_ahead.answers_taken():  # this loop re-initialises with a JoinInterrupt's answer
            while True:
                try:
                    sync, hosts = _new_world(not skip_sync)
                    additions.world_formed(hosts)
                    if sync:
                        additions.before_sync()
                        state.sync()
                    return fn(state, *args, **kwargs)
                except HorovodInternalError:
                    additions.failed()
                    state.restore()
                    skip_sync, answer = False, None
                except HostsUpdatedInterrupt as exc:
                    skip_sync, answer = exc.skip_sync, getattr(exc, "answer", None)
                additions.between_worlds()
                additions.reinitialised(_reset(answer, gloo_timeout))
                state.on_reset()
    finally:
        notification_manager.remove_listener(state)
        additions.close()
