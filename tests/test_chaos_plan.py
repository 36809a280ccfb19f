"""The chaos soak's schedule and settings (:mod:`testbed.chaos`), without a bed."""

from __future__ import annotations

import pytest

from testbed.chaos import FAULTS, SoakConfig, percentiles, plan


def test_the_schedule_is_the_seeds_alone():
    config = SoakConfig(seed=7, mtbf=15.0)
    assert plan(config, 50) == plan(SoakConfig(seed=7, mtbf=15.0), 50)
    assert plan(config, 50) != plan(SoakConfig(seed=8, mtbf=15.0), 50)
    times = [at for at, _ in plan(config, 400)]
    assert times == sorted(times)
    gaps = [b - a for a, b in zip([0.0, *times], times)]
    assert 12 < sum(gaps) / len(gaps) < 18  # exponential gaps around the mean asked for
    assert min(gaps) < 2  # some faults land on the heels of the one before
    assert {kind for _, kind in plan(config, 400)} == set(FAULTS)


def test_joins_are_about_a_fifth_of_the_schedule():
    kinds = [kind for _, kind in plan(SoakConfig(seed=424242), 1000)]
    assert 0.17 < kinds.count("host-new") / len(kinds) < 0.25
    assert all(kinds.count(other) < kinds.count("host-new") for other in FAULTS if other != "host-new")


def test_the_schedule_draws_only_the_kinds_asked_for():
    config = SoakConfig(seed=1, kinds=("drain", "partition"))
    assert {kind for _, kind in plan(config, 100)} == {"drain", "partition"}


@pytest.mark.parametrize("settings, message", [
    ({"kinds": ("drain", "flood")}, "unknown fault kind 'flood'"),
    ({"min_np": 5}, "min_np 5 exceeds the 4 hosts"),
    ({"max_impaired": 3}, "would leave 1 of 4, below min_np 2 with no spare"),
    ({"mtbf": 0}, "mtbf must be > 0 seconds, got 0"),
    ({"faults": 0}, "faults must be >= 1, got 0"),
    ({"hold": (5.0, 1.0)}, "hold must be (low, high)"),
    ({"max_hosts": 3}, "max_hosts (3) must be >= hosts (4)"),
])
def test_a_schedule_that_can_make_the_job_impossible_is_refused(settings, message):
    with pytest.raises(ValueError) as info:
        SoakConfig(seed=1, **settings).validate()
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_below_min_np_is_allowed_when_it_is_the_point():
    assert SoakConfig(seed=1, max_impaired=3, below_min_np=True).validate().max_impaired == 3


def test_percentiles():
    assert percentiles([]) == {"p50": None, "p90": None, "max": None, "n": 0}
    assert percentiles([4.0]) == {"p50": 4.0, "p90": 4.0, "max": 4.0, "n": 1}
    got = percentiles([float(x) for x in range(1, 11)])
    assert got["p50"] == 5.5 and got["max"] == 10.0 and 9.0 <= got["p90"] <= 10.0


class _Agent:
    def __init__(self, log: list, host: str):
        self.log, self.host = log, host

    def stop(self):
        self.log.append(("stop agent", self.host))


class _Cluster:
    """What a host-new fault touches of ElasticCluster: the bed's hosts and the node agents."""

    slots = 1

    def __init__(self, workdir, hosts: int):
        self.workdir, self.log = workdir, []
        self.bed = type("Bed", (), {"hosts": {f"h{i}": None for i in range(1, hosts + 1)}})()
        self.agents = {}

    def add_host(self) -> str:
        host = f"h{len(self.bed.hosts) + 1}"
        self.bed.hosts[host] = None
        self.start_agent(host)
        return host

    def start_agent(self, host: str) -> None:
        self.log.append(("start agent", host))
        self.agents[host] = _Agent(self.log, host)


def test_host_new_keeps_joining_once_the_bed_is_full(tmp_path):
    """Before: hosts added by host-new stayed for good, so once the bed reached max_hosts every later
    host-new was a skip (1 injected and 19 skipped in the 200-fault soak).  Now each is decommissioned
    after a hold and a later host-new boots it again."""
    from testbed.chaos import NEW, SPARE, Soak

    (tmp_path / "soak").mkdir()
    cluster = _Cluster(tmp_path, hosts=2)
    soak = Soak(cluster, SoakConfig(seed=1, hosts=2, max_hosts=3, min_np=1, kinds=("host-new",)))
    assert soak.inject(0, "host-new") and soak.state["h3"] == NEW
    assert not soak.inject(1, "host-new")  # full, and no spare yet
    (followup,) = soak.followups
    soak.followups.clear()
    soak._run_followup(followup)
    assert followup.host == "h3" and soak.state["h3"] == SPARE and soak.spares() == ["h3"]
    assert soak.inject(2, "host-new") and soak.state["h3"] == NEW  # the spare boots again
    assert cluster.log == [("start agent", "h3"), ("stop agent", "h3"), ("start agent", "h3")]
    assert soak.counts == {"injected": 2, "skipped": 1, "job_deaths": 0}
