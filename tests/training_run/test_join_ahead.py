"""Join-ahead's questions and verdicts, against horovodrun's own elastic rendezvous server.

The server is Horovod's (``RendezvousServer`` with ``create_rendezvous_handler``);
only its driver is a recording stand-in, so what a question records and what the
relay forwards are the real handler's.  The whole join, under a real horovodrun,
is ``test_run_jobs.py``'s and the bed's (``tests/multihost/test_standby_join.py``).
"""

from __future__ import annotations

import queue
import threading
import time

import pytest
from horovod.common.exceptions import HostsUpdatedInterrupt
from horovod.runner.common.util.hosts import SlotInfo
from horovod.runner.elastic.rendezvous import create_rendezvous_handler
from horovod.runner.http.http_server import RendezvousServer

from hvd_elastic.training._internal import join_ahead, rendezvous
from hvd_elastic.training._internal.compat import HostUpdateResult
from hvd_elastic.training._internal.join_ahead import HostCheck, JoinInterrupt

NEXT = SlotInfo(hostname="here", rank=1, local_rank=0, cross_rank=1, size=3, local_size=1, cross_size=3)


class Driver:
    """What the rendezvous handler asks of horovodrun's driver: who recorded ready, and each one's next slot."""

    def __init__(self, slot: SlotInfo = NEXT):
        self.ready: list[tuple[str, int]] = []
        self.slot = slot
        self.release = threading.Event()
        self.release.set()

    def record_ready(self, host, local_rank):
        self.ready.append((host, local_rank))
        assert self.release.wait(10), "the test never released the driver's barrier"

    def get_slot_info(self, host, local_rank):
        return self.slot


@pytest.fixture
def driver(monkeypatch):
    driver = Driver()
    server = RendezvousServer()
    port = server.start(create_rendezvous_handler(driver))
    server.init([NEXT])
    monkeypatch.setenv(rendezvous.ADDR_ENV, "127.0.0.1")
    monkeypatch.setenv(rendezvous.PORT_ENV, str(port))
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    monkeypatch.setenv("HOROVOD_HOSTNAME", "here")
    yield driver
    server.stop()


def real() -> rendezvous.Server:
    return rendezvous.Server.from_env()


def test_an_early_question_records_the_slot_ready_and_returns_its_place_in_the_next_world(driver):
    assert real().ask_rank_and_size("here", 0) == "1,3,0,1,1,3"
    assert driver.ready == [("here", 0)]


def test_the_relay_answers_rank_and_size_itself_and_forwards_everything_else(driver):
    upstream = real()
    with rendezvous.answered_init("1,3,0,1,1,3"):
        relayed = rendezvous.Server.from_env()
        assert relayed.addr == "127.0.0.1" and relayed.port != upstream.port
        assert relayed.ask_rank_and_size("here", 0) == "1,3,0,1,1,3"
        assert relayed.request("PUT", "/global/0", b"address of rank 0")[0] == 200
        assert relayed.request("GET", "/global/0") == (200, b"address of rank 0")
        assert relayed.request("GET", "/global/1")[0] == 404  # Gloo's "not yet": relayed, not retried
    assert driver.ready == []  # the relay answered: the driver never counted this slot again
    assert rendezvous.Server.from_env() == upstream  # the real server is named again
    assert upstream.request("GET", "/global/0") == (200, b"address of rank 0")  # the PUT reached the driver
    assert upstream.waiting(range(3)) == {0}


def test_a_relay_left_by_an_error_still_names_the_real_server_again(driver):
    upstream = real()
    with pytest.raises(RuntimeError, match="init failed"):
        with rendezvous.answered_init("1,3,0,1,1,3"):
            raise RuntimeError("init failed")
    assert rendezvous.Server.from_env() == upstream


def test_outside_an_elastic_job_there_is_no_server(monkeypatch):
    monkeypatch.delenv(rendezvous.ADDR_ENV, raising=False)
    assert rendezvous.Server.from_env() is None
    with pytest.raises(RuntimeError, match="HOROVOD_GLOO_RENDEZVOUS_ADDR"):
        with rendezvous.answered_init("0,1,0,1,0,1"):
            pass


def test_a_malformed_answer_is_an_error_naming_it():
    with pytest.raises(ValueError, match="'1,2': expected six"):
        rendezvous.world_size("1,2")


# -- the verdicts, on rank 0 of a world of two (the broadcast is the identity) -----------------------


@pytest.fixture
def rank0(driver, monkeypatch):
    monkeypatch.setattr(join_ahead.hvd, "rank", lambda: 0)
    monkeypatch.setattr(join_ahead.hvd, "size", lambda: 2)
    monkeypatch.setattr(join_ahead.hvd, "local_rank", lambda: 0)
    with join_ahead.answers_taken():  # as inside hvd_elastic.run's loop
        yield driver


class Host:
    """A state's side of the host check: its notification queue and last timestamp."""

    def __init__(self, enabled: bool = True):
        self.check = HostCheck(lambda obj: obj, enabled)
        self.messages: queue.Queue = queue.Queue()
        self.last = 0.0

    def notify(self, timestamp: float, update: HostUpdateResult) -> None:
        self.messages.put((timestamp, update))

    def commit(self) -> HostsUpdatedInterrupt | None:
        self.last, interrupt = self.check.check(self.last, self.messages)
        return interrupt

    def steady(self) -> None:
        """Two quick commits: the check knows commits come often."""
        assert self.commit() is None and self.commit() is None


def until(predicate, what: str, limit: float = 10.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_added_hosts_train_on_until_the_newcomers_wait_at_the_rendezvous_then_go_with_the_answer(rank0):
    host = Host()
    host.steady()
    host.notify(5.0, HostUpdateResult.added)

    assert host.commit() is None  # ask: no interrupt, training goes on
    until(lambda: rank0.ready, "the early question")
    assert rank0.ready == [("here", 0)]
    for _ in range(3):
        assert host.commit() is None  # wait: the new world's third rank is not at its rendezvous yet
    real().request("PUT", "/global/2", b"newcomer's address")

    interrupt = until(host.commit, "the go verdict")
    assert isinstance(interrupt, JoinInterrupt) and interrupt.answer == "1,3,0,1,1,3"
    assert not interrupt.skip_sync  # the newcomer needs the state
    assert host.last == 5.0
    assert rank0.ready == [("here", 0)]  # asked once: the re-initialisation takes the answer
    assert host.commit() is None  # the next world starts without a question


def test_a_newcomer_that_never_comes_ends_the_wait_after_gloos_timeout_and_asks_again(rank0, monkeypatch):
    monkeypatch.setenv(rendezvous.GLOO_TIMEOUT_ENV, "0.4")
    host = Host()
    host.steady()
    host.notify(5.0, HostUpdateResult.added)
    assert host.commit() is None
    time.sleep(0.5)

    interrupt = host.commit()
    assert isinstance(interrupt, JoinInterrupt) and interrupt.answer is None
    assert host.last == 5.0


def test_notifications_while_asking_are_held_for_the_next_world(rank0):
    host = Host()
    host.steady()
    host.notify(5.0, HostUpdateResult.added)
    assert host.commit() is None
    host.notify(6.0, HostUpdateResult.removed)
    assert host.commit() is None  # still waiting for the newcomer: the removal waits too
    real().request("PUT", "/global/2", b"newcomer's address")
    assert isinstance(until(host.commit, "the go verdict"), JoinInterrupt)

    interrupt = host.commit()  # the next world's first check
    assert type(interrupt) is HostsUpdatedInterrupt and interrupt.skip_sync  # hosts were only removed
    assert host.last == 6.0


@pytest.mark.parametrize("update, skip_sync", [(HostUpdateResult.removed, True), (HostUpdateResult.mixed, False)])
def test_anything_but_an_addition_is_horovods_rule(rank0, update, skip_sync):
    host = Host()
    host.steady()
    host.notify(5.0, update)
    interrupt = host.commit()
    assert type(interrupt) is HostsUpdatedInterrupt and interrupt.skip_sync is skip_sync
    assert rank0.ready == []


def test_switched_off_or_with_rare_commits_an_addition_stops_the_world_at_once(rank0, monkeypatch):
    host = Host(enabled=False)
    host.steady()
    host.notify(5.0, HostUpdateResult.added)
    assert type(host.commit()) is HostsUpdatedInterrupt

    monkeypatch.setenv(rendezvous.GLOO_TIMEOUT_ENV, "0.4")
    host = Host()
    host.commit()
    time.sleep(0.2)  # commits every 0.2 s: more than a quarter of the rendezvous timeout apart
    host.notify(5.0, HostUpdateResult.added)
    assert type(host.commit()) is HostsUpdatedInterrupt
    assert rank0.ready == []


def test_a_state_under_horovods_own_loop_joins_the_stock_way(driver, monkeypatch):
    # hvd.elastic.run re-initialises by asking the driver again: an early question would count twice.
    monkeypatch.setattr(join_ahead.hvd, "rank", lambda: 0)
    host = Host()
    host.steady()
    host.notify(5.0, HostUpdateResult.added)
    assert type(host.commit()) is HostsUpdatedInterrupt
    assert driver.ready == []


def test_a_reset_for_another_reason_drops_the_question(rank0):
    host = Host()
    host.steady()
    host.notify(5.0, HostUpdateResult.added)
    assert host.commit() is None
    host.check.reset()  # a failed collective: the state's reset()
    assert host.commit() is None  # no question, and the addition was taken as asked: nothing to raise
