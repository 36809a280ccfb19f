"""run_elastic's order of steps around failures and host updates, and its one check for Gloo's loop.

The world's first collective (the sync agreement and the hosts), Horovod's re-initialisation and the
hang-up are replaced by recorders, so the order is seen exactly; the state is a recorder too.  The loop
check runs for real against this process's descriptors (gloo_shapes.GlooLikeLoop stands in for Gloo's
loop).
"""

from __future__ import annotations

import logging

import pytest
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

from gloo_shapes import GlooLikeLoop
from hvd_elastic.training._internal import elastic_loop, gloo_hangup, health_cut
from hvd_elastic.training._internal.join_ahead import JoinInterrupt
from hvd_elastic.training.settings import WorkerSettings


class RecordingState:
    def __init__(self, calls: list[str]):
        self.calls = calls

    def sync(self):
        self.calls.append("sync")

    def restore(self):
        self.calls.append("restore")

    def on_reset(self):
        self.calls.append("on_reset")

    def on_hosts_updated(self, timestamp, update_res):
        pass


@pytest.fixture
def world(monkeypatch):
    """Record the loop's steps; ``world["sizes"]`` are the sizes of successive worlds (the last repeats)."""
    calls: list[str] = []
    sizes = [2]

    def new_world(mine):
        calls.append(f"new_world({mine})")
        return mine, ["here", "there"]  # as if this rank alone decided

    def reset(answer, gloo_timeout):
        calls.append("reset" if answer is None else f"reset({answer})")
        if len(sizes) > 1:
            sizes.pop(0)
        return ()  # a driver without hvd-elastic's rules names no hosts

    monkeypatch.setattr(elastic_loop, "_new_world", new_world)
    monkeypatch.setattr(elastic_loop, "_reset", reset)
    monkeypatch.setattr(elastic_loop.hvd, "size", lambda: sizes[0])
    monkeypatch.setattr(elastic_loop.hvd, "gloo_enabled", lambda: True)
    return {"calls": calls, "sizes": sizes}


def loop(fn, state, settings: WorkerSettings = WorkerSettings(health_cut=False), **kwargs):
    """The loop under test; the health cut off unless a test stubs it (no Consul reader here)."""
    return elastic_loop.run_elastic(fn, state, settings=settings, **kwargs)


def failing(calls: list[str], outcomes: list[BaseException | None]):
    """A training function raising ``outcomes`` in turn, then returning "done"."""
    pending = iter(outcomes)

    def fn(state):
        calls.append("fn")
        outcome = next(pending, None)
        if outcome is not None:
            raise outcome
        return "done"

    return fn


def test_a_failure_hangs_up_before_restoring_and_a_host_update_never_hangs_up(world, monkeypatch):
    calls = world["calls"]
    monkeypatch.setattr(gloo_hangup, "hang_up_if_stalled", lambda: calls.append("hang_up") or [])
    monkeypatch.setattr(gloo_hangup, "check_found", lambda: calls.append("check_found") or True)
    fn = failing(calls, [HorovodInternalError("peer lost"), HostsUpdatedInterrupt(skip_sync=True),
                         HostsUpdatedInterrupt(skip_sync=False)])

    assert loop(fn, RecordingState(calls)) == "done"
    assert calls == [
        "new_world(True)", "check_found", "sync", "fn",
        "hang_up", "restore", "reset", "on_reset",  # the failure: peers hear of it before anything else
        "new_world(True)", "sync", "fn",
        "reset", "on_reset",  # hosts removed: no hang-up, no restore, the sync may be skipped
        "new_world(False)", "fn",
        "reset", "on_reset",  # hosts added: no hang-up, no restore
        "new_world(True)", "sync", "fn",
    ]


def test_a_join_ahead_answer_reaches_only_the_reset_its_interrupt_causes(world):
    calls = world["calls"]
    fn = failing(calls, [JoinInterrupt("1,3,1,2,0,1"), HorovodInternalError("peer lost"), JoinInterrupt(None)])

    assert loop(fn, RecordingState(calls)) == "done"
    assert [c for c in calls if c.startswith("reset")] == ["reset(1,3,1,2,0,1)", "reset", "reset"]
    assert calls.count("sync") == 4  # a join always syncs: the newcomer needs the state


def test_a_missing_gloo_loop_is_one_warning_per_run_in_the_first_world_of_two(world, caplog):
    caplog.set_level(logging.WARNING, logger=gloo_hangup.__name__)
    world["sizes"][:] = [1, 2]  # a world of one has no pairs: the check waits for the next world
    calls = world["calls"]
    fn = failing(calls, [HorovodInternalError("first"), HorovodInternalError("second"),
                         HorovodInternalError("third")])

    assert loop(fn, RecordingState(calls)) == "done"
    assert calls.count("fn") == 4
    warnings = [r for r in caplog.records if r.name == gloo_hangup.__name__ and r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]

    caplog.clear()
    with GlooLikeLoop():
        assert loop(failing(calls, [HorovodInternalError("again")]), RecordingState(calls)) \
            == "done"
    assert [r for r in caplog.records if r.levelno == logging.WARNING] == []


def test_with_the_hang_up_off_the_loop_is_not_checked(world, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger=gloo_hangup.__name__)
    calls = world["calls"]
    assert loop(failing(calls, []), RecordingState(calls), settings=WorkerSettings(gloo_hangup=False)) == "done"
    assert caplog.records == []


def test_before_sync_runs_right_before_every_sync_and_only_then(world, monkeypatch):
    calls = world["calls"]
    monkeypatch.setattr(gloo_hangup, "hang_up_if_stalled", lambda: [])
    monkeypatch.setattr(gloo_hangup, "check_found", lambda: True)
    fn = failing(calls, [HorovodInternalError("peer lost"), HostsUpdatedInterrupt(skip_sync=True)])

    assert loop(fn, RecordingState(calls), before_sync=lambda: calls.append("before_sync")) \
        == "done"
    assert calls == [
        "new_world(True)", "before_sync", "sync", "fn",
        "restore", "reset", "on_reset", "new_world(True)", "before_sync", "sync", "fn",
        "reset", "on_reset", "new_world(False)", "fn",  # no sync, no check: nobody is new
    ]


class RecordingCut:
    def __init__(self, calls: list[str]):
        self.calls = calls

    def set_world(self, hosts):
        self.calls.append(f"set_world({','.join(hosts)})")

    def between_worlds(self):
        self.calls.append("between_worlds")

    def stop(self):
        self.calls.append("cut.stop")


@pytest.fixture
def cut_on(world, monkeypatch):
    """The world, with a recording health cut and the Gloo checks stubbed; its call list."""
    calls = world["calls"]
    monkeypatch.setattr(health_cut, "start", lambda settings: RecordingCut(calls))
    monkeypatch.setattr(gloo_hangup, "hang_up_if_stalled", lambda: [])
    monkeypatch.setattr(gloo_hangup, "check_found", lambda: True)
    return calls


def test_the_health_cut_learns_each_worlds_hosts_and_forgets_them_across_a_reset(cut_on):
    calls = cut_on
    fn = failing(calls, [HorovodInternalError("peer lost")])

    assert loop(fn, RecordingState(calls)) == "done"
    assert calls == [
        "new_world(True)", "set_world(here,there)", "sync", "fn",
        "restore", "between_worlds", "reset", "on_reset",
        "new_world(True)", "set_world(here,there)", "sync", "fn",
        "cut.stop",
    ]


def test_the_health_cut_learns_the_new_worlds_hosts_from_the_driver_before_its_first_collective(cut_on,
                                                                                                   monkeypatch):
    calls = cut_on

    def reset(answer, gloo_timeout):
        calls.append("reset")
        return ("here", "elsewhere")  # what the driver rules said the new world is

    monkeypatch.setattr(elastic_loop, "_reset", reset)
    fn = failing(calls, [HorovodInternalError("peer lost")])

    assert loop(fn, RecordingState(calls)) == "done"
    assert calls[4:9] == ["restore", "between_worlds", "reset", "set_world(here,elsewhere)", "on_reset"]
