"""hvd_elastic.training._internal.pace: the own-work clock, its windows, the judge and its streaks, the policy.

In one process (a world of one): the clock runs on a real Horovod ``DistributedOptimizer``, whose
``synchronize()`` is made to take a known time on a hand-driven clock, so every figure is exact.
The judge runs on synthetic figures: noisy but healthy jobs (per-step noise, window medians as the
ranks compute them) are never flagged; a 3x host is, after exactly ``windows`` windows, once.
The real multi-process runs are ``test_pace_jobs.py``.
"""

from __future__ import annotations

import random
import statistics

import pytest
import torch

import horovod.torch as hvd
from horovod.common.exceptions import HorovodInternalError

from hvd_elastic.envvars import ConfigError
from hvd_elastic.training._internal import pace
from hvd_elastic.training._internal.pace import Closed, Pace, PacePolicy, Streaks, WaitClock, judge
from hvd_elastic.training.events import EventLog
from hvd_elastic.training.runner import RunConfig, run
from hvd_elastic.training.sampler import ExactlyOnceSampler
from hvd_elastic.training.settings import WorkerSettings
from hvd_elastic.training.state import TrainingState


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvd.init()
    yield


class HandClock:
    """A clock that moves only when told: ``advance(seconds)``."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def horovod_optimizer(clock: HandClock | None = None, wait: list[float] | None = None):
    """A real DistributedOptimizer; with ``clock``, each ``synchronize()`` first moves it by ``wait[0]`` s (the
    allreduce wait a fast rank would see), then runs Horovod's own."""
    model = torch.nn.Linear(3, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), op=hvd.Sum)
    if clock is not None and wait is not None:
        real = optimizer.synchronize

        def waiting() -> None:
            clock.advance(wait[0])
            real()

        optimizer.synchronize = waiting
    return model, optimizer


def train_step(model, optimizer, clock: HandClock | None = None, work: float = 0.0) -> None:
    optimizer.zero_grad()
    model(torch.ones(2, 3)).sum().backward()
    if clock is not None:
        clock.advance(work)
    optimizer.step()  # calls synchronize()


# ------------------------------------------------------------------------------------------------ the wait clock

def test_the_wait_clock_times_synchronize_as_step_calls_it_and_puts_it_back():
    clock, wait = HandClock(), [0.7]
    model, optimizer = horovod_optimizer(clock, wait)
    before = vars(optimizer)["synchronize"]
    waits = WaitClock(clock)
    assert waits.watch(optimizer) and waits.watching
    train_step(model, optimizer)
    train_step(model, optimizer)
    assert waits.waited == pytest.approx(1.4)
    optimizer.zero_grad()
    model(torch.ones(2, 3)).sum().backward()
    optimizer.synchronize()  # an AMP loop calls it itself, then steps without it
    with optimizer.skip_synchronize():
        optimizer.step()
    assert waits.waited == pytest.approx(2.1)
    waits.unwatch()
    assert vars(optimizer)["synchronize"] is before and not waits.watching
    train_step(model, optimizer)
    assert waits.waited == pytest.approx(2.1)


def test_unwatching_leaves_horovods_own_method_when_there_was_no_instance_attribute():
    model, optimizer = horovod_optimizer()
    waits = WaitClock()
    assert waits.watch(optimizer)
    train_step(model, optimizer)
    assert waits.waited > 0
    waits.unwatch()
    waits.unwatch()  # idempotent
    assert "synchronize" not in vars(optimizer)
    train_step(model, optimizer)


def test_an_optimizer_that_is_not_horovods_is_left_alone():
    optimizer = torch.optim.SGD(torch.nn.Linear(3, 1).parameters(), lr=0.1)
    waits = WaitClock()
    assert not waits.watch(optimizer) and not waits.watch(None)
    assert not waits.watching and "synchronize" not in vars(optimizer)


# ------------------------------------------------------------------------------------------------ windows

def timed_pace(window: int, warmup: int, wait: float = 0.7) -> tuple[Pace, HandClock, list[float], object, object]:
    clock, waits = HandClock(), [wait]
    model, optimizer = horovod_optimizer(clock, waits)
    tracker = Pace(PacePolicy(window=window, warmup=warmup), clock)
    tracker.waits.watch(optimizer)
    tracker.restart()
    return tracker, clock, waits, model, optimizer


def commit(tracker: Pace, sampler=None) -> Closed | None:
    closed = tracker.lap(sampler)
    tracker.resume()
    return closed


def test_own_work_is_the_time_between_commits_less_the_allreduce_wait():
    tracker, clock, waits, model, optimizer = timed_pace(window=4, warmup=0)
    assert commit(tracker) is None  # the first commit of an entry ends no measured step
    closed = None
    for work in (0.30, 0.10, 0.20):
        train_step(model, optimizer, clock, work)
        clock.advance(0.05)  # the rest of the step: loss logging, data
        closed = commit(tracker)
    assert closed == Closed(median=pytest.approx(0.25), steps=3)
    # The commit's own bookkeeping (between lap and resume: event log, checkpoints, the gather) is nobody's step.
    train_step(model, optimizer, clock, 0.4)
    assert tracker.lap() is None
    clock.advance(5.0)
    tracker.resume()
    for work in (0.6, 0.5, 0.45):
        train_step(model, optimizer, clock, work)
        closed = commit(tracker)
    assert closed == Closed(median=pytest.approx(0.475), steps=4)


def test_a_window_is_a_fixed_number_of_commits_and_its_figures_are_its_own():
    tracker, clock, waits, model, optimizer = timed_pace(window=3, warmup=0)
    closes = []
    for number in range(1, 10):
        train_step(model, optimizer, clock, 0.1 * number)
        closed = commit(tracker)
        closes.append(None if closed is None else (number, closed.steps, round(closed.median, 6)))
    # Commit 1 measures nothing (no step began before it); windows close at commits 3, 6, 9 on every rank.
    assert [c for c in closes if c] == [(3, 2, 0.25), (6, 3, 0.5), (9, 3, 0.8)]


def test_the_first_steps_after_every_restart_are_not_counted_and_windows_start_over():
    tracker, clock, waits, model, optimizer = timed_pace(window=5, warmup=2)
    for _ in range(3):  # commits 1-3 of an entry that a reset interrupts
        train_step(model, optimizer, clock, 9.0)
        commit(tracker)
    tracker.restart()  # the function is entered again, on every rank
    closes = []
    for work in (9.0, 8.0, 7.0, 0.2, 0.4):  # commit 1 measures nothing, steps 1-2 are the warm-up
        train_step(model, optimizer, clock, work)
        closes.append(commit(tracker))
    assert closes[:4] == [None] * 4 and closes[4] == Closed(median=pytest.approx(0.3), steps=2)


def test_steps_that_are_not_whole_global_steps_and_commits_without_a_step_are_not_counted():
    # 10 samples in steps of 4 over 2 ranks: 4, 4, then a tail of 2 (one sample per rank).
    sampler = ExactlyOnceSampler(10, batch_size=2, rank=0, world_size=2)
    tracker, clock, waits, model, optimizer = timed_pace(window=5, warmup=0)
    commit(tracker, sampler)  # the entry's first commit
    for work in (0.1, 0.3, 5.0):  # two whole steps, then the tail
        train_step(model, optimizer, clock, work)
        sampler.record_batch()
        assert commit(tracker, sampler) is None
    clock.advance(7.0)  # the epoch's end: state.epoch += 1, state.commit() without a step
    sampler.set_epoch(1)
    closed = commit(tracker, sampler)
    assert closed == Closed(median=pytest.approx(0.2), steps=2)


def test_a_world_whose_step_is_smaller_than_the_world_counts_nothing():
    sampler = ExactlyOnceSampler(40, batch_size=1, rank=0, world_size=4)
    sampler.set_world(0, 4, step_samples=2)  # a global batch of 2 over 4 ranks: two idle every step
    tracker, clock, waits, model, optimizer = timed_pace(window=3, warmup=0)
    for _ in range(3):
        train_step(model, optimizer, clock, 0.1)
        sampler.record_batch()
        closed = commit(tracker, sampler)
    assert closed == Closed(median=None, steps=0)


# ------------------------------------------------------------------------------------------------ the judge

def window_figures(rng: random.Random, hosts: dict[str, tuple[int, float]], sigma: float,
                   steps: int = 50) -> list[tuple[str, float]]:
    """Each rank's window median of ``steps`` noisy steps: per host (ranks, typical own-work seconds)."""
    figures = []
    for host, (ranks, seconds) in hosts.items():
        for _ in range(ranks):
            samples = [seconds * rng.lognormvariate(0, sigma) + (rng.random() < 0.05) * 10 * seconds
                       for _ in range(steps)]  # 5% of steps hit a 10x hiccup (GC, a page fault, a busy core)
            figures.append((host, statistics.median(samples)))
    return figures


@pytest.mark.parametrize("sigma", [0.2, 0.6, 1.0])
def test_noisy_but_healthy_hosts_are_never_flagged(sigma):
    rng = random.Random(47)
    streaks = Streaks(3)
    hosts = {"a": (2, 0.030), "b": (2, 0.030), "c": (1, 0.033), "d": (1, 0.028)}
    reported, slow_windows = [], 0
    for _ in range(2000):
        verdict = judge(window_figures(rng, hosts, sigma), 1.5)
        slow_windows += sum(h.slow for h in verdict.hosts)
        reported += streaks.update(verdict)
    # A lone slow window happens (a 1-rank host's median over 50 noisy steps); a streak of three never does.
    assert reported == [] and slow_windows <= 0.02 * 2000 * len(hosts)


def test_a_loaded_machine_widens_the_spread_instead_of_flagging_a_host():
    # A host 1.6x the median but within what the ranks' spread explains (MAD rule), on one window.
    figures = [("a", 1.0), ("b", 1.3), ("c", 1.6), ("d", 2.0), ("e", 2.6)]
    verdict = judge(figures, 1.5)
    assert verdict.judged and verdict.job_median_s == 1.6
    e = next(h for h in verdict.hosts if h.host == "e")
    assert e.ratio == pytest.approx(1.625) and not e.slow


def test_a_3x_host_is_reported_once_after_windows_windows():
    rng = random.Random(3)
    streaks = Streaks(3)
    hosts = {"fast-a": (2, 0.030), "fast-b": (1, 0.030), "slow": (1, 0.090)}
    reports = []
    for window in range(1, 11):
        verdict = judge(window_figures(rng, hosts, 0.3), 1.5)
        assert [h.host for h in verdict.hosts if h.slow] == ["slow"]
        reports += [(window, h.host, round(h.ratio)) for h in streaks.update(verdict)]
    assert reports == [(3, "slow", 3)]


def test_recovery_ends_the_streak_and_a_new_streak_is_reported_again():
    streaks = Streaks(3)
    slow = [("a", 1.0), ("a", 1.0), ("b", 1.0), ("c", 3.0)]
    healthy = [("a", 1.0), ("a", 1.0), ("b", 1.0), ("c", 1.05)]
    pattern = [slow, slow, healthy, slow, slow, slow, slow, healthy, slow, slow, slow]
    reported = [number for number, figures in enumerate(pattern, 1) if streaks.update(judge(figures, 1.5))]
    assert reported == [6, 11]


def test_fewer_than_three_ranks_are_never_judged():
    for figures in ([("a", 1.0), ("b", 3.0)], [("a", 1.0), ("b", 10.0), ("c", None)], [("a", 0.5)]):
        verdict = judge(figures, 1.5)
        assert not verdict.judged and not any(h.slow for h in verdict.hosts)
    verdict = judge([("a", 1.0), ("b", 3.0)], 1.5)
    assert verdict.job_median_s == 2.0 and [round(h.ratio, 2) for h in verdict.hosts] == [0.5, 1.5]
    assert judge([("a", None), ("b", None)], 1.5) == pace.Verdict(None, (), False)


def test_a_host_with_half_the_ranks_is_the_jobs_pace_not_a_straggler():
    verdict = judge([("a", 1.0), ("a", 1.0), ("b", 3.0), ("b", 3.0)], 1.5)
    assert verdict.judged and not any(h.slow for h in verdict.hosts)
    # With a third host the slow one is a minority again.
    verdict = judge([("a", 1.0), ("a", 1.0), ("c", 1.0), ("b", 3.0), ("b", 3.0)], 1.5)
    assert [h.host for h in verdict.hosts if h.slow] == ["b"]


def test_a_host_figure_is_the_median_of_its_ranks_and_its_speed_the_inverse_ratio():
    verdict = judge([("a", 0.010), ("a", 0.012), ("a", 0.011), ("b", 0.011), ("c", 0.044)], 1.5)
    hosts = {h.host: h for h in verdict.hosts}
    assert verdict.job_median_s == 0.011
    assert hosts["a"].seconds == 0.011 and hosts["a"].ranks == 3 and hosts["a"].speed == pytest.approx(1.0)
    assert hosts["c"].slow and hosts["c"].speed == pytest.approx(0.25)


def test_a_window_that_cannot_be_judged_breaks_every_streak():
    streaks = Streaks(2)
    slow = [("a", 1.0), ("b", 1.0), ("c", 3.0)]
    assert streaks.update(judge(slow, 1.5)) == []
    assert streaks.update(judge([("a", 1.0), ("c", 3.0)], 1.5)) == []  # the world shrank to 2
    assert streaks.update(judge(slow, 1.5)) == []
    assert [h.host for h in streaks.update(judge(slow, 1.5))] == ["c"]


# ------------------------------------------------------------------------------------------------ the policy

@pytest.mark.parametrize("field, value, expected", [
    ("threshold", 1, "straggler_threshold=1 is not a number > 1"),
    ("threshold", 0.5, "straggler_threshold=0.5 is not a number > 1"),
    ("threshold", float("nan"), "straggler_threshold=nan is not a number > 1"),
    ("window", 0, "straggler_window=0 is not a positive integer"),
    ("windows", 0, "straggler_windows=0 is not a positive integer"),
    ("windows", 2.5, "straggler_windows=2.5 is not a positive integer"),
    ("window", True, "straggler_window=True is not a positive integer"),
    ("mode", "Drain", "straggler='Drain' is not one of off, report, drain"),
    ("warmup", -1, "warmup=-1 is not an integer >= 0"),
])
def test_a_policy_that_makes_no_sense_is_one_line_naming_the_value(field, value, expected):
    with pytest.raises(ConfigError) as caught:
        PacePolicy(**{field: value})
    assert str(caught.value).startswith(expected) and "\n" not in str(caught.value)


@pytest.mark.parametrize("field, value", [("straggler_threshold", 1.0), ("straggler_window", 0),
                                          ("straggler_windows", -3), ("straggler", "Report")])
def test_run_config_refuses_the_same_values_naming_its_field(field, value):
    with pytest.raises(ConfigError, match=rf"^{field}={value!r} is not "):
        RunConfig(**{field: value})


def test_run_config_wins_over_the_variables_field_by_field():
    settings = WorkerSettings(straggler="off", straggler_threshold=2.0, straggler_window=10, straggler_windows=4)
    assert PacePolicy.resolve(RunConfig().straggler_settings(), settings) == PacePolicy("off", 2.0, 10, 4)
    given = RunConfig(straggler="report", straggler_window=20).straggler_settings()
    assert PacePolicy.resolve(given, settings) == PacePolicy("report", 2.0, 20, 4)
    assert PacePolicy.resolve({}, WorkerSettings()) == PacePolicy()  # the default policy is report
    assert PacePolicy().on and not PacePolicy(mode="off").on


# ------------------------------------------------------------------------------------------------ in the run decorator

@pytest.mark.parametrize("policy", ["report", "off"])
def test_a_world_of_one_gathers_nothing_and_the_optimizer_is_given_back(tmp_path, policy):
    model, optimizer = horovod_optimizer()
    state = TrainingState(model=model, optimizer=optimizer, step=0)

    @run(event_log=tmp_path / "events.jsonl", straggler=policy, straggler_window=2)
    def train(state):
        while state.step < 6:
            train_step(model, optimizer)
            state.commit_step()
        return vars(optimizer).get("synchronize")

    timed = train(state)
    assert callable(timed) == (policy == "report")  # timed while training, only when measuring
    assert "synchronize" not in vars(optimizer)
    names = [e["event"] for e in EventLog.read(tmp_path / "events.jsonl")]
    assert names.count("commit") == 6 and "pace" not in names and "straggler" not in names


def test_a_listeners_horovod_error_is_raised_from_the_commit_and_any_other_is_logged(caplog):
    state = TrainingState(model=torch.nn.Linear(3, 1), step=0)
    failures = [HorovodInternalError("allgather failed: a peer is gone"), ValueError("a broken listener")]

    def listener(event, fields):
        if event == "commit" and failures:
            raise failures.pop(0)

    state.add_listener(listener)
    with pytest.raises(HorovodInternalError, match="a peer is gone"):
        state.commit()  # the elastic loop restores and resets, as after its own collectives
    state.commit()
    assert "a broken listener" in caplog.text and state.commit_count == 2
