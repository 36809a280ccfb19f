"""hvd_elastic.training._internal.rendezvous.leave_if_doomed against Horovod's own rendezvous server with the
driver rules: a rank inside a reset's ``hvd.init()`` whose world the driver gave up leaves it after the grace
(its host spared by the driver), and nothing else makes it leave."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from horovod.runner.elastic.rendezvous import create_rendezvous_handler
from horovod.runner.http.http_server import RendezvousServer

from hvd_elastic.horovodrun import rules
from hvd_elastic.training._internal import rendezvous
from tests.horovodrun.rules_driver import driver_with_rules


@pytest.fixture
def driver():
    with driver_with_rules() as fake:
        fake.start_world("a", "b")
        yield fake


class Exits:
    """What the watch would end the process with, and when."""

    def __init__(self):
        self.codes: list[int] = []
        self.at: float | None = None
        self.done = threading.Event()

    def __call__(self, code: int) -> None:
        self.codes.append(code)
        self.at = time.monotonic()
        self.done.set()


def test_a_rank_inside_a_given_up_worlds_init_leaves_after_the_grace_and_its_host_is_spared(driver):
    exits = Exits()
    with rendezvous.leave_if_doomed(driver.client, exits):
        time.sleep(2 * rendezvous.DOOM_POLL_S)
        assert not exits.codes  # a world that can still form: the rank waits for it
        rules._doom(driver, "b[0] exited 137")
        doomed = time.monotonic()
        assert exits.done.wait(30), "the rank stayed inside the given-up world's hvd.init()"
    assert exits.codes == [rendezvous.DOOMED_EXIT]
    assert exits.at - doomed >= rendezvous.DOOM_GRACE_S  # Gloo's own 503s get the grace first
    assert "127.0.0.1" in driver._hvd_elastic.sent_away  # the driver will not hold this host out for it


def test_a_rank_out_of_init_before_the_grace_ends_is_left_alone(driver):
    exits = Exits()
    with rendezvous.leave_if_doomed(driver.client, exits):
        rules._doom(driver, "b[0] exited 137")
        time.sleep(rendezvous.DOOM_POLL_S)  # hvd.init() returned (it failed on the 503s, or the world formed)
    time.sleep(rendezvous.DOOM_GRACE_S + 2 * rendezvous.DOOM_POLL_S)
    assert not exits.codes


def test_without_the_driver_rules_or_a_server_nothing_watches():
    server = RendezvousServer()
    port = server.start(create_rendezvous_handler(SimpleNamespace()))  # Horovod's own handler: no world to read
    try:
        exits = Exits()
        with rendezvous.leave_if_doomed(rendezvous.Server("127.0.0.1", port), exits):
            time.sleep(3 * rendezvous.DOOM_POLL_S)
        assert not [t for t in threading.enumerate() if t.name == "hvd-elastic-doom-watch"]
        with rendezvous.leave_if_doomed(None, exits):
            pass
        assert not exits.codes
    finally:
        server.stop()
