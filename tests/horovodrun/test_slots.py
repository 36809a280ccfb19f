"""hvd_elastic.horovodrun.slots in one process: each worker's own event, and which workers rule 7 ends.

The real job (a worker stuck in a given-up world, ended, the next world training) is
``test_driver_jobs.py::test_a_worker_stuck_in_a_given_up_worlds_rendezvous_is_ended``.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

from hvd_elastic.horovodrun import slots


def started(workers: slots.Workers, *keys) -> dict:
    """Start a worker per (host, slot) through ``workers``' wrapper; each runs until one of its events is set.
    Returns the events each got, by key."""
    got: dict = {}
    ready = threading.Barrier(len(keys) + 1)

    def create_worker_fn(slot_info, events):
        got[(slot_info.hostname, slot_info.local_rank)] = events
        ready.wait()
        while not any(event.wait(0.01) for event in events):
            pass
        return 143, 0.0

    wrapped = workers.wrap(create_worker_fn)
    for host, slot in keys:
        threading.Thread(target=wrapped, args=(SimpleNamespace(hostname=host, local_rank=slot), [threading.Event()]),
                         daemon=True).start()
    ready.wait(5)
    return got


def test_each_worker_gets_an_event_of_its_own_after_horovods_and_leaves_when_it_ends():
    workers = slots.Workers()
    got = started(workers, ("a", 0), ("a", 1))
    assert all(len(events) == 2 for events in got.values())
    assert workers.unregistered() == [("a", 0), ("a", 1)]
    workers.registered(("a", 1))
    assert workers.unregistered() == [("a", 0)]
    workers.end(("a", 0))
    assert got[("a", 0)][-1].is_set() and not got[("a", 1)][-1].is_set()
    for _ in range(500):
        if workers.unregistered() == []:
            break
        threading.Event().wait(0.01)
    assert workers.unregistered() == []  # the ended worker's slot is gone; the registered one runs on
    workers.end(("a", 1))


class Driver:
    def __init__(self, recorded=(), assigned=("a", "b", "c")):
        self._rank_assignments = {0: "world"}
        self._worker_registry = SimpleNamespace(get_recorded_slots=lambda: list(recorded))
        self.assigned = assigned
        self.done = False

    def finished(self):
        return self.done

    def has_rank_assignment(self, host, slot):
        return host in self.assigned


def test_only_unregistered_unrecorded_workers_of_the_same_doomed_world_are_ended():
    workers = slots.Workers()
    got = started(workers, ("a", 0), ("b", 0), ("c", 0), ("d", 0))
    workers.registered(("c", 0))  # got through hvd.init(): a survivor
    driver = Driver(recorded=[("b", 0)])  # b asked for its place in the next world; d is not in this world
    spared: set[str] = set()
    slots._end_stuck(driver, driver._rank_assignments, workers, lambda: True, spared)
    ended = {key for key, events in got.items() if events[-1].is_set()}
    assert ended == {("a", 0)} and spared == {"a"}
    for key in got:
        workers.end(key)


def test_nothing_is_ended_once_the_world_is_replaced_no_longer_doomed_or_the_driver_finished():
    for change in ("replaced", "not doomed", "finished"):
        workers = slots.Workers()
        got = started(workers, ("a", 0))
        driver = Driver()
        world = driver._rank_assignments
        if change == "replaced":
            driver._rank_assignments = {0: "next"}
        driver.done = change == "finished"
        spared: set[str] = set()
        slots._end_stuck(driver, world, workers, lambda: change != "not doomed", spared)
        assert not got[("a", 0)][-1].is_set() and not spared, change
        workers.end(("a", 0))


def test_a_worker_ended_here_never_reads_as_finished():
    """safe_shell_exec may report 0 for a shell it terminated (its ending thread reaps the shell first)."""
    workers = slots.Workers()
    wrapped = workers.wrap(lambda slot_info, events: (0, 1.0))
    assert wrapped(SimpleNamespace(hostname="a", local_rank=0), []) == (0, 1.0)  # a real finish stays one

    def ended_then_zero(slot_info, events):
        workers.end((slot_info.hostname, slot_info.local_rank))
        return 0, 2.0

    wrapped = workers.wrap(ended_then_zero)
    assert wrapped(SimpleNamespace(hostname="a", local_rank=0), []) == (slots.ENDED_EXIT, 2.0)


def test_what_rule_8_asks_whether_a_worker_ever_got_through_init():
    workers = slots.Workers()
    got = started(workers, ("a", 0), ("b", 0))
    workers.registered(("a", 0))
    assert workers.any_registered()
    workers.end(("a", 0))
    for _ in range(500):
        if not workers.any_registered():
            break
        threading.Event().wait(0.01)
    assert not workers.any_registered() and workers.exited_registered(("a", 0))
    assert not workers.exited_registered(("b", 0))  # still running: no exit of it yet
    workers.end(("b", 0))
    for _ in range(500):
        if not workers.unregistered():
            break
        threading.Event().wait(0.01)
    assert not workers.exited_registered(("b", 0)) and got[("b", 0)][-1].is_set()
