"""Stragglers, phase 1: each rank's own work per step, one small gather per window, a verdict on slow hosts.

Ring-allreduce training runs at the pace of its slowest rank: a host three
times slower than the others keeps every other rank waiting at every step,
nothing fails, and so nothing tells the operator.  This module finds such a
host; the run decorator (:mod:`hvd_elastic.training.runner`) reports it.

**What is measured.**  A rank's *own work* per step, not its wall time.
Every rank takes the same wall time per step (the gradient allreduce makes
them wait for each other); where they spend it differs.  A fast rank
finishes its backward pass early and waits inside the allreduce for the slow
one, which arrives last and hardly waits.  So own work is the wall time from
the end of one commit (its host check, a collective where every rank waits
for the last) to the next commit, minus the time spent inside the Horovod
``DistributedOptimizer``'s ``synchronize()``, where the gradients' wait
happens (:class:`WaitClock` wraps the instance's method; ``step()`` calls
it, and so does an AMP loop that calls it itself).  A collective of the
script's own between two commits (a loss allreduce) is not subtracted: it
counts as every rank's work, which dilutes the ratio but flags nobody.  With another
optimizer there is no wait to subtract: own work is the wall time, the same
on every rank, and such a job never shows a straggler.

**Which steps count.**  Only steps: a commit that recorded no samples (the
``state.commit()`` at an epoch's end) closes an interval without a figure.
With an :class:`~hvd_elastic.training.sampler.ExactlyOnceSampler`, a step
that took other than whole global steps (an epoch's tail, absorbing the
remainder; the last step that leaves ranks idle with ``batch is None``) is
not counted, nor is any step of a world whose step has fewer samples than
ranks (some rank idles every step).  The first ``warmup`` steps after every
(re-)entry of the training function are not counted either: a new world's
first steps pay for new iterators, Horovod's response cache, a newcomer's
first optimizer step.

**When it is gathered.**  Every ``window`` commits since the function was
last entered, each rank offers ``(host, median own work of its counted
steps)`` in ONE :func:`~hvd_elastic.training._internal.objects.allgather_object`:
no collective per step.  Every rank of a world makes the same commits in
lockstep (each commit's host check is itself a collective) and re-enters
the function after every reset, so every rank closes each window at the same
commit and the gather cannot deadlock.  The policy is rank 0's (the run
decorator carries it at every sync), so ranks never disagree about whether
or when to gather.  Not piggy-backed on the commit's own collective (the host
check's broadcast): that one carries rank 0's bytes only, and making every
rank contribute would change join-ahead's protocol at every commit for a
figure needed once per window.

**How a host is judged** (:func:`judge`, pure).  The ranks' figures give the
job's median ``m`` and their MAD (median absolute deviation, scaled by 1.4826
to estimate a standard deviation).  A host's figure is the median of its
ranks' figures, its ratio that figure over ``m``.  A host is slow in a
window when its ratio is at least ``threshold`` AND its figure lies above
``m + 3 * MAD``: the ratio says slow enough to matter, the MAD says beyond
what the ranks' spread explains (a loaded machine where every rank wobbles
widens the spread, not one host's ratio).  It is a straggler once it was
slow in ``windows`` windows in a row (:class:`Streaks`), reported once per
streak; one window not slow ends the streak.  Fewer than 3 figures are not
judged: the median of two is their mean, so a rank 3x slower than the other
is only 1.5x "the median" (10x: 1.8x), and the MAD of two equals each one's
deviation, so neither rule could tell a slow host from a noisy pair.  A host
holding half the ranks or more moves the median itself: it is the job's
pace, not a straggler.

**What is done about it.**  :class:`Streaks` returns the hosts that became
stragglers; rank 0 reports them, and under policy ``drain`` asks for the
slowest one's drain within its limits (:mod:`.straggler_drain`), the node
agent lifting the drain after a cool-down.

Contract:

* collective only when a window closes: one ``allgather_object`` named
  ``hvd_elastic.pace`` on every rank of the world at the same commit;
* a failed gather raises Horovod's ``HorovodInternalError`` like any of the
  state's collectives (the state lets a listener's Horovod errors through),
  so the elastic loop recovers as from a failed commit;
* the judgement is deterministic: every rank judges the same gathered figures
  and keeps the same streaks, so a new rank 0 continues them;
* a bad setting is a :class:`~hvd_elastic.envvars.ConfigError` of one line
  naming the value and what was expected (:class:`PacePolicy`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any, Callable

from hvd_elastic.envvars import Check, ConfigError
from hvd_elastic.training import settings as worker_settings
from hvd_elastic.training._internal import compat, objects

MIN_RANKS = 3  # fewer figures are not judged (see "How a host is judged")
MAD_SCALE = 1.4826  # MAD x this estimates the standard deviation of normal noise
MAD_CUT = 3.0  # a slow host lies above the median by more than this many scaled MADs
DEFAULT_WARMUP = 5  # steps not counted after every (re-)entry of the training function


@dataclasses.dataclass(frozen=True)
class PacePolicy:
    """The detector's settings, checked (``RunConfig``'s ``straggler*`` fields or their variables).

    The default policy is ``report``: it costs a clock read per commit, a wrapper around
    ``synchronize()`` and one allgather of a few dozen bytes per rank every ``window`` commits, and it
    never acts, so it cannot hurt a job; what it finds (an event, a warning, a gauge) is what an
    operator needs to act.  ``drain`` changes the job's membership and needs node agents that carry
    out requests: its owner opts in.

    Raises:
        ConfigError: a policy not in ``STRAGGLER_POLICIES``, a threshold <= 1, a window or windows < 1.
    """

    mode: str = "report"
    threshold: float = 1.5
    window: int = 50
    windows: int = 3
    warmup: int = DEFAULT_WARMUP

    def __post_init__(self) -> None:
        for name, (attribute, check, kind) in FIELDS.items():
            check_value(name, getattr(self, attribute), check, kind)
        if not isinstance(self.warmup, int) or isinstance(self.warmup, bool) or self.warmup < 0:
            raise ConfigError(f"warmup={self.warmup!r} is not an integer >= 0")

    @property
    def on(self) -> bool:
        """Whether anything is measured (every policy but ``off``)."""
        return self.mode != "off"

    @classmethod
    def resolve(cls, given: Mapping[str, Any], settings: worker_settings.WorkerSettings) -> "PacePolicy":
        """The policy from ``given`` (``RunConfig``'s fields: name -> value, or None for its variable), the
        rest from ``settings``.  Raises ConfigError as the class does."""
        return cls(**{attribute: given[name] if given.get(name) is not None else getattr(settings, name)
                      for name, (attribute, _, _) in FIELDS.items()})


#: ``RunConfig``'s straggler fields (also ``WorkerSettings``'): the policy attribute each sets, its check, its types.
FIELDS: dict[str, tuple[str, Check, tuple[type, ...]]] = {
    "straggler": ("mode", worker_settings.STRAGGLER_POLICY, (str,)),
    "straggler_threshold": ("threshold", worker_settings.STRAGGLER_THRESHOLD, (int, float)),
    "straggler_window": ("window", worker_settings.STRAGGLER_COUNT, (int,)),
    "straggler_windows": ("windows", worker_settings.STRAGGLER_COUNT, (int,)),
}


def check_given(given: Mapping[str, Any]) -> None:
    """Raise ConfigError naming the first of ``FIELDS`` set in ``given`` (not None) whose value does not fit."""
    for name, (_, check, kind) in FIELDS.items():
        if given.get(name) is not None:
            check_value(name, given[name], check, kind)


def check_value(name: str, value: Any, check: Check, kind: tuple[type, ...]) -> None:
    """Raise ConfigError ``NAME=VALUE is not EXPECTED`` unless ``value`` is a ``kind`` that ``check`` accepts."""
    if isinstance(value, bool) or not isinstance(value, kind) or not check.accept(value):
        raise ConfigError(f"{name}={value!r} is not {check.expected}")


class WaitClock:
    """Seconds this rank spent inside a Horovod optimizer's ``synchronize()`` (the allreduce wait), summed.

    :meth:`watch` replaces the optimizer instance's ``synchronize`` with a timed call of the same
    method; :meth:`unwatch` puts back what was there.  Any optimizer that is not Horovod's is left alone.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.waited = 0.0
        self._watched: tuple[Any, Any] | None = None  # (optimizer, its instance attribute before, or None)

    def watch(self, optimizer: Any) -> bool:
        """Time ``optimizer.synchronize()`` from now on; False (nothing done) for a non-Horovod optimizer."""
        self.unwatch()
        if optimizer is None or not compat.is_horovod_optimizer(optimizer):
            return False
        inner = optimizer.synchronize

        def synchronize(*args: Any, **kwargs: Any) -> Any:
            start = self.clock()
            try:
                return inner(*args, **kwargs)
            finally:
                self.waited += self.clock() - start

        self._watched = (optimizer, vars(optimizer).get("synchronize"))
        optimizer.synchronize = synchronize
        return True

    @property
    def watching(self) -> bool:
        """Whether an optimizer's ``synchronize`` is being timed."""
        return self._watched is not None

    def unwatch(self) -> None:
        """Put back the watched optimizer's ``synchronize`` as it was (idempotent)."""
        if self._watched is None:
            return
        optimizer, before = self._watched
        self._watched = None
        if before is None:
            vars(optimizer).pop("synchronize", None)
        else:
            optimizer.synchronize = before


@dataclasses.dataclass(frozen=True)
class Closed:
    """A window that just closed on this rank: the median own work of its counted steps (None: none counted)."""

    median: float | None
    steps: int


class Pace:
    """This rank's own work per step, in windows of ``policy.window`` commits (see the module docstring).

    Per commit the run decorator calls :meth:`lap` at the state's "commit" event and :meth:`resume` at
    "committed", once the commit's host check passed (so its own event-log and checkpoint work, the
    gather and the host check's wait are nobody's step), and :meth:`restart` at every (re-)entry of
    the training function.
    """

    def __init__(self, policy: PacePolicy, clock: Callable[[], float] = time.perf_counter) -> None:
        self.policy = policy
        self.waits = WaitClock(clock)
        self._figures: list[float] = []
        self._commits = 0  # since the last restart: every rank of the world agrees on it
        self._steps = 0  # steps seen since the last restart (the warm-up counts these)
        self._since: tuple[float, float] | None = None  # (clock, waited) when the current interval began
        self._position: int | None = None

    def restart(self) -> None:
        """A new entry of the training function (a new world, or the same after a failure): windows restart."""
        self._figures.clear()
        self._commits = self._steps = 0
        self._since = None
        self._position = None

    def lap(self, sampler: Any = None) -> Closed | None:
        """A commit: count the step that ended here; a :class:`Closed` when this commit ends a window."""
        now, waited = self.waits.clock(), self.waits.waited
        position = _position(sampler)
        taken = None if position is None or self._position is None else position[0] - self._position
        full = position is None or (taken is not None and _whole_steps(taken, position[1], position[2]))
        if self._since is not None and (taken is None or taken > 0):  # taken == 0: a commit, not a step
            self._steps += 1
            if full and self._steps > self.policy.warmup:
                self._figures.append(max(0.0, (now - self._since[0]) - (waited - self._since[1])))
        self._position = None if position is None else position[0]
        self._since = None  # until resume(): the commit's rest is no step's
        self._commits += 1
        if self._commits % self.policy.window:
            return None
        closed = Closed(statistics.median(self._figures) if self._figures else None, len(self._figures))
        self._figures.clear()
        return closed

    def resume(self) -> None:
        """The commit is over (its host check passed): the next step's interval begins."""
        self._since = (self.waits.clock(), self.waits.waited)


def _position(sampler: Any) -> tuple[int, int, int] | None:
    """(samples passed since epoch 0, samples of a whole global step, world size) of an ExactlyOnceSampler-like
    sampler; None for anything else (then every commit after the first is a step)."""
    try:
        return (int(sampler.epoch) * int(sampler.num_samples) + int(sampler.offset), int(sampler.step_samples),
                int(sampler.world_size))
    except (AttributeError, TypeError, ValueError):  # None, another sampler, one without a step yet
        return None


def _whole_steps(taken: int, step: int, world: int) -> bool:
    """Whether ``taken`` samples are whole global steps in which every rank had a batch."""
    return taken > 0 and step >= world and taken % step == 0


def exchange(host: str, median: float | None) -> list[tuple[str, float | None]]:
    """Collective: every rank's ``(host, window median)``, in rank order (one small allgather)."""
    gathered = objects.allgather_object((host, median), name="hvd_elastic.pace")
    return [(str(h), None if s is None else float(s)) for h, s in gathered]


@dataclasses.dataclass(frozen=True)
class HostPace:
    """One host in one window."""

    host: str
    seconds: float  # the median of its ranks' own-work medians
    ratio: float  # seconds over the job's median: 1 typical, 3 three times slower
    ranks: int
    slow: bool  # an outlier in this window (both rules of judge())

    @property
    def speed(self) -> float:
        """Relative speed, the gauge's value: the job's median over this host's figure (1 typical, 0.33 slow)."""
        return 1.0 / self.ratio if self.ratio > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One window's figures judged: the job's median (None: no figures) and every host, by name."""

    job_median_s: float | None
    hosts: tuple[HostPace, ...]
    judged: bool  # False: fewer than MIN_RANKS figures, nobody can be slow


def judge(figures: Sequence[tuple[str, float | None]], threshold: float) -> Verdict:
    """The window's :class:`Verdict` from every rank's ``(host, median own work)``; a None figure (a rank
    that counted no step) is left out.  Pure: the rules are the module docstring's."""
    measured = [(h, s) for h, s in figures if s is not None and math.isfinite(s) and s >= 0]
    if not measured:
        return Verdict(None, (), False)
    values = [s for _, s in measured]
    middle = statistics.median(values)
    spread = MAD_SCALE * statistics.median(abs(v - middle) for v in values)
    judged = len(values) >= MIN_RANKS and middle > 0
    by_host: dict[str, list[float]] = {}
    for host, seconds in measured:
        by_host.setdefault(host, []).append(seconds)
    hosts = []
    for host, seconds_list in sorted(by_host.items()):
        seconds = statistics.median(seconds_list)
        ratio = seconds / middle if middle > 0 else 1.0
        slow = judged and ratio >= threshold and seconds > middle + MAD_CUT * spread
        hosts.append(HostPace(host, seconds, ratio, len(seconds_list), slow))
    return Verdict(middle, tuple(hosts), judged)


class Streaks:
    """Consecutive slow windows per host.  :meth:`update` returns the hosts whose streak reached
    ``windows`` in this window: each is a straggler, returned once per streak."""

    def __init__(self, windows: int) -> None:
        self.windows = windows
        self.counts: dict[str, int] = {}

    def update(self, verdict: Verdict) -> list[HostPace]:
        # A window that could not be judged (too few ranks) breaks every streak: they are "in a row".
        previous, self.counts = self.counts, {}
        reached = []
        for host in verdict.hosts:
            if host.slow:
                self.counts[host.host] = previous.get(host.host, 0) + 1
                if self.counts[host.host] == self.windows:
                    reached.append(host)
        return reached
