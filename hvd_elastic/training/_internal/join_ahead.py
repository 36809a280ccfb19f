"""A join that does not stop the survivors: they train on while horovodrun starts the newcomer.

In stock Horovod, hosts added to the job stop every worker at its next commit
(``HostsUpdatedInterrupt``), and only when every one of them has re-entered
``hvd.init()`` and asked the driver for its place in the next world does the
driver start the new workers (:mod:`.rendezvous`).  The survivors then wait
through the newcomer's whole start: ssh, interpreter, imports, ``hvd.init()``.

Here the survivors ask that question early, from a thread, and keep training
in the old world while the driver starts the newcomers; they leave the old
world once the newcomers wait at the new world's rendezvous, and their
re-initialisation is answered from the early answer.  What the survivors wait
for is then their own re-initialisation, the sync and a first step: not the
newcomer's start, with or without a standby.

The protocol rides on the host check every commit already makes: one
broadcast from rank 0, which now carries a verdict as well.

``ask``
    Hosts were only added since the last reset, the job runs under
    horovodrun's elastic Gloo driver and in a loop that re-initialises with
    the answer (:func:`answers_taken`: ``hvd_elastic.run``'s, not
    ``hvd.elastic.run``), commits come more often than every quarter of Gloo's
    rendezvous timeout, and ``HVD_ELASTIC_JOIN_AHEAD`` is not false.  Every
    rank starts a :class:`Question`; nothing is raised.
``wait``
    Asking, and the newcomers are not all at their rendezvous yet.
``go``
    As many ranks wait at the new world's rendezvous as it adds.  Every rank
    raises :class:`JoinInterrupt` with its answer; the reset re-initialises
    through :func:`.rendezvous.answered_init`.
``again``
    Rank 0's question failed, the driver gave the new world up (a newcomer
    failed, :mod:`hvd_elastic.horovodrun`'s rule 5), or the newcomers did not
    come within Gloo's rendezvous timeout (a stock join would have timed out
    as well).  The
    interrupt has no answer: the re-initialisation asks the driver again, as a
    stock reset does, which records the rank as leaving the world that never
    formed, and the driver starts the next world without the missing host.
(none)
    Horovod's own rule: raise when a newer notification came, with
    ``skip_sync`` when hosts were only removed.

Notifications that come while asking are held for the first check of the next
world.  A reset for another reason while asking (a failed collective) drops
the question (:meth:`HostCheck.reset`): its re-initialisation asks again, which
a driver whose barrier has not passed yet counts once, and one whose barrier
has passed takes as leaving the new world.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import queue
import threading
import time
from typing import Any, Callable

import horovod.torch as hvd
from hvd_elastic.envvars import horovod_hostname
from hvd_elastic.training._internal import rendezvous
from hvd_elastic.training._internal.compat import HostUpdateResult
from horovod.common.exceptions import HostsUpdatedInterrupt

log = logging.getLogger(__name__)

POLL_S = 0.02  # rank 0's look at the forming world's store
ANSWER_WAIT_S = 10.0  # a rank's wait for its own answer once rank 0 has one (the driver sent both at once)


class Verdict(enum.Enum):
    """Rank 0's verdict at a check, broadcast with the hosts' timestamps (the module docstring says each)."""

    ASK = "ask"
    WAIT = "wait"
    GO = "go"
    AGAIN = "again"


_loops_taking_answers = 0  # how many elastic loops of this process re-initialise with a JoinInterrupt's answer


@contextlib.contextmanager
def answers_taken():
    """Within: the elastic loop re-initialises with a :class:`JoinInterrupt`'s answer.  Horovod's own
    ``hvd.elastic.run`` would ask the driver again, so a state outside this block joins the stock way."""
    global _loops_taking_answers
    _loops_taking_answers += 1
    try:
        yield
    finally:
        _loops_taking_answers -= 1


class JoinInterrupt(HostsUpdatedInterrupt):
    """Hosts were added and the newcomers are ready: leave this world now.  ``answer`` is this rank's
    place in the next one, for :func:`.rendezvous.answered_init`; None: ask the driver again."""

    def __init__(self, answer: str | None):
        super().__init__(skip_sync=False)
        self.answer = answer


class Question:
    """This slot's early ``rank_and_size`` question, asked from a thread; with ``watch``, then the wait
    for the newcomers: ``arrived`` is set once as many ranks as the new world adds to ``old_size`` wait
    at its rendezvous."""

    def __init__(self, server: rendezvous.Server, host: str, local_rank: int, old_size: int, watch: bool):
        self.answer: str | None = None
        self.error: BaseException | None = None
        self.doomed = ""  # why the driver gave the new world up ('' while it has not)
        self.answered = threading.Event()
        self.arrived = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(server, host, local_rank, old_size, watch),
                                        name="hvd-elastic-join-ahead", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self, server: rendezvous.Server, host: str, local_rank: int, old_size: int, watch: bool) -> None:
        try:
            self.answer = server.ask_rank_and_size(host, local_rank)
            size = rendezvous.world_size(self.answer)
        except (*rendezvous.ERRORS, ValueError) as exc:
            self.error = exc
            return
        finally:
            self.answered.set()
        if not watch:
            return
        # Until the survivors come, the ranks waiting at the new world's rendezvous are newcomers; a key
        # stays there until the rendezvous completes, so a rank seen once need not be asked again.
        waiting: set[int] = set()
        while len(waiting) < size - old_size:
            try:
                world = server.world()
                if world is None:  # a driver without hvd-elastic's rules: ask Gloo's keys one by one
                    waiting |= server.waiting(set(range(size)) - waiting)
                elif world.doomed:  # a newcomer failed: this world will never form, ask again now
                    self.doomed = world.doomed
                    return
                else:
                    waiting = set(world.present)
            except rendezvous.ERRORS:
                pass  # the driver is busy or gone: look again, the deadline ends the wait
            if len(waiting) < size - old_size and self._stop.wait(POLL_S):
                return  # dropped: this world ended another way
        self.arrived.set()


class HostCheck:
    """Horovod's ``State.check_host_updates``, with the join-ahead verdicts.

    ``broadcast(obj)`` is the collective that gives every rank rank 0's object.
    """

    def __init__(self, broadcast: Callable[[Any], Any], enabled: bool):
        self._broadcast = broadcast
        self._enabled = enabled  # the worker's join_ahead setting (HVD_ELASTIC_JOIN_AHEAD)
        self._server = rendezvous.Server.from_env()
        self._deadline_s = rendezvous.gloo_timeout()
        self._held: list[tuple[float, int]] = []
        self._question: Question | None = None
        self._asked_timestamp = 0.0
        self._asked_at = 0.0
        self._last_check: float | None = None
        self._interval = float("inf")

    def check(self, last_updated: float, messages: queue.Queue) -> tuple[float, HostsUpdatedInterrupt | None]:
        """Collective: the new ``last_updated`` timestamp, and the interrupt to raise (None: train on)."""
        now = time.monotonic()
        if self._last_check is not None:
            self._interval = now - self._last_check
        self._last_check = now
        while not messages.empty():
            self._held.append(messages.get())
        if self._question is None:
            newest, update = self._fold(last_updated)
            self._held.clear()
        else:
            newest, update = last_updated, HostUpdateResult.no_update
        verdict = self._verdict(last_updated, newest, update, now) if hvd.rank() == 0 else None
        prev, newest, update, verdict = self._broadcast((last_updated, newest, update, verdict))
        if verdict == Verdict.ASK:
            self._ask(newest, now)
            return prev, None
        if verdict == Verdict.WAIT:
            return prev, None
        if verdict in (Verdict.GO, Verdict.AGAIN):
            answer = self._answer_for(verdict)
            asked, self._asked_timestamp = self._asked_timestamp, 0.0
            self.reset()
            return asked, JoinInterrupt(answer)
        if newest > prev:
            return newest, HostsUpdatedInterrupt(update == HostUpdateResult.removed)
        return newest, None

    def reset(self) -> None:
        """Drop the question (after any reset: the next world starts without one)."""
        if self._question is not None:
            self._question.stop()
            self._question = None

    def _fold(self, last_updated: float) -> tuple[float, int]:
        newest, update = last_updated, HostUpdateResult.no_update
        for timestamp, result in self._held:
            if timestamp > last_updated:
                newest = max(newest, timestamp)
                update |= result
        return newest, update

    def _verdict(self, prev: float, newest: float, update: int, now: float) -> Verdict | None:
        question = self._question
        if question is not None:
            if question.arrived.is_set():
                return Verdict.GO
            if question.error is not None or question.doomed or now - self._asked_at > self._deadline_s:
                return Verdict.AGAIN
            return Verdict.WAIT
        if (newest > prev and update == HostUpdateResult.added and self._enabled and self._server is not None
                and _loops_taking_answers > 0 and self._interval < self._deadline_s / 4):
            return Verdict.ASK
        return None

    def _ask(self, timestamp: float, now: float) -> None:
        self._asked_timestamp, self._asked_at = timestamp, now
        if self._server is None:  # rank 0 has one; horovodrun gives every rank the same environment
            log.warning("join ahead: rank 0 asked, but this rank's environment names no elastic rendezvous server "
                        "(%s, %s, HOROVOD_ELASTIC=1): it will re-initialise the stock way",
                        rendezvous.ADDR_ENV, rendezvous.PORT_ENV)
            return
        self._question = Question(self._server, horovod_hostname(), hvd.local_rank(),
                                  hvd.size(), watch=hvd.rank() == 0)
        if hvd.rank() == 0:
            log.info("hosts added: training on at %d ranks while horovodrun starts the new ones", hvd.size())

    def _answer_for(self, verdict: Verdict) -> str | None:
        question = self._question
        if verdict == Verdict.AGAIN:
            if hvd.rank() == 0 and question is not None and question.doomed:
                log.warning("join ahead: the new world cannot form: %s; re-initialising the stock way",
                            question.doomed)
            elif hvd.rank() == 0:  # rank 0's verdict: one line per job, not per rank
                log.warning("join ahead: the new hosts did not reach their rendezvous within %.0f s (%s); "
                            "re-initialising the stock way", self._deadline_s, _why(question))
            return None
        if question is None or not question.answered.wait(ANSWER_WAIT_S) or question.answer is None:
            log.warning("join ahead: no answer from the rendezvous server (%s); re-initialising the stock way",
                        _why(question))
            return None
        return question.answer


def _why(question: Question | None) -> str:
    if question is None or question.error is None:
        return "no error"
    return f"{type(question.error).__name__}: {question.error}"
