"""Lost-host judging (hvd_elastic.health.lost) and the launcher's reaper, without a job.

The judge runs on a fake clock; the reaper's session finder and killer run on a
real process tree shaped like horovodrun's (a parent, a session-leading
middleman per worker, a shell under it carrying ``HOROVOD_HOSTNAME=``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from hvd_elastic.consul.config import ConfigError
from hvd_elastic.health import hosts as hostlib
from hvd_elastic.discovery import reaper
from hvd_elastic.health import lost
from hvd_elastic.health.lost import HostState, LostHostJudge
from testbed import wait_until


def check(check_id: str, status: str, output: str = "") -> dict:
    return {"CheckID": check_id, "Status": status, "Output": output}


def entry(node: str, *checks: dict, slots: str = "1") -> dict:
    return {"Node": {"Node": node, "Address": "10.0.0.1"},
            "Service": {"ID": f"svc-{node}", "Service": "horovod", "Meta": {"slots": slots}, "Tags": []},
            "Checks": list(checks) or [check("serfHealth", "passing")]}


def decisions(*entries: dict) -> list[hostlib.Decision]:
    return hostlib.evaluate(list(entries))


HEALTHY = entry("a")
FAILED = entry("a", check("serfHealth", "passing"), check("service:a", "critical", "TTL expired"))
DRAINED = entry("a", check("service:a", "critical", "TTL expired"), check("_node_maintenance", "critical"))


def test_host_states_tell_failed_from_drained_and_judge_nothing_else():
    states = lost.host_states(decisions(
        FAILED, entry("b", check("_service_maintenance:svc-b", "critical")),
        entry("c"), entry("d", check("service:d", "warning")), entry("bad_name"),
    ))
    assert states["a"][0] is HostState.FAILED and "TTL expired" in states["a"][1]
    assert states["b"][0] is HostState.DRAINED
    assert states["c"][0] is HostState.HEALTHY
    assert states["d"][0] is HostState.UNKNOWN  # warning: discovery drops it, nobody cuts for it
    assert states["bad_name"][0] is HostState.UNKNOWN
    # Maintenance wins over a failed check: a drain never rolls back.
    assert lost.host_states(decisions(DRAINED))["a"][0] is HostState.DRAINED
    # A host is as good as its best instance.
    assert lost.host_states(decisions(FAILED, entry("a")))["a"][0] is HostState.HEALTHY


@pytest.mark.parametrize("raw, expected", [("", 1.0), ("0", 0.0), ("2.5", 2.5)])
def test_grace_from_env(raw, expected):
    assert lost.grace_from_env({lost.GRACE_ENV: raw}) == expected


@pytest.mark.parametrize("raw", ["-1", "soon", "inf", "nan"])
def test_a_bad_grace_is_named(raw):
    with pytest.raises(ConfigError, match=rf"HVD_ELASTIC_HEALTH_GRACE='{raw}' is not a duration >= 0"):
        lost.grace_from_env({lost.GRACE_ENV: raw})


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def judge(watched=("a",), grace=1.0):
    clock = Clock()
    return LostHostJudge(grace, watched=lambda: watched, on_lost=lambda h, w: None, clock=clock), clock


def test_a_host_failed_for_the_grace_is_lost_once():
    j, clock = judge()
    j.answer(decisions(HEALTHY), 1, 0)
    j.answer(decisions(FAILED), 2, 0)
    clock.now += 0.9
    assert j.due() == []
    clock.now += 0.2
    assert [h for h, _ in j.due()] == ["a"]
    j.answer(decisions(FAILED), 3, 0)
    clock.now += 5
    assert j.due() == [], "a host is reported once per failure"
    j.answer(decisions(HEALTHY), 4, 0)
    j.answer(decisions(FAILED), 5, 0)
    clock.now += 1
    assert [h for h, _ in j.due()] == ["a"], "a host that recovered can be lost again"


def test_a_flapping_check_never_acts():
    j, clock = judge()
    for n in range(20):  # critical 0.6 s, passing 0.4 s, over and over
        j.answer(decisions(FAILED if n % 2 == 0 else HEALTHY), n + 1, 0)
        clock.now += 0.6 if n % 2 == 0 else 0.4
        assert j.due() == []


def test_drained_unwatched_and_unseen_hosts_are_never_lost():
    j, clock = judge(watched=("a",))
    j.answer(decisions(HEALTHY, entry("b")), 1, 0)
    j.answer(decisions(DRAINED, entry("b", check("service:b", "critical"))), 2, 0)
    clock.now += 10
    assert j.due() == []  # a is drained, b is not watched
    fresh, clock = judge()
    fresh.answer(decisions(FAILED), 1, 0)  # never seen healthy: a failure from before the judge knew it
    clock.now += 10
    assert fresh.due() == []


def test_an_unreachable_or_restarted_consul_is_no_evidence():
    j, clock = judge()
    j.answer(decisions(HEALTHY), 1, 0)
    j.answer(decisions(FAILED), 2, 0)
    clock.now += 0.5
    j.failure("connection refused")
    clock.now += 30
    assert j.due() == []
    # Back: every check critical until the node agents update again; not held against the host.
    j.answer(decisions(FAILED), 3, 0)
    clock.now += 10
    assert j.due() == []
    j.answer(decisions(HEALTHY), 4, 0)
    j.answer(decisions(FAILED), 5, 0)
    clock.now += 1
    assert [h for h, _ in j.due()] == ["a"]


def test_the_judge_thread_calls_on_lost_after_the_grace():
    calls = []
    j = LostHostJudge(0.3, watched=lambda: {"a"}, on_lost=lambda h, w: calls.append((h, time.monotonic())))
    stop = threading.Event()
    thread = threading.Thread(target=j.run, args=(stop,), daemon=True)
    thread.start()
    try:
        j.answer(decisions(HEALTHY), 1, 0)
        failed_at = time.monotonic()
        j.answer(decisions(FAILED), 2, 0)
        wait_until("on_lost called", lambda: calls, 10)
        assert calls[0][0] == "a" and calls[0][1] - failed_at >= 0.3
    finally:
        stop.set()
        thread.join(5)


def run_judge(j: LostHostJudge, seconds: float) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=j.run, args=(stop, 0.1), daemon=True)
    thread.start()
    try:
        time.sleep(seconds)
    finally:
        stop.set()
        thread.join(5)


def test_a_declined_host_is_asked_again_at_each_poll_and_an_unwatched_one_costs_no_spin():
    asked, watched_calls = [], []

    def watched():
        watched_calls.append(1)
        return {"a"}

    j = LostHostJudge(0.0, watched=watched, on_lost=lambda h, w: asked.append(h) or False)
    j.answer(decisions(HEALTHY, entry("b")), 1, 0)
    j.answer(decisions(FAILED, entry("b", check("service:b", "critical"))), 2, 0)  # b failed, never watched
    run_judge(j, 1.0)
    # Polls every 0.1 s: ~10 askings of a (declined each time), not thousands of wake-ups for b.
    assert 5 <= len(asked) <= 15 and set(asked) == {"a"}
    assert len(watched_calls) <= 15


def test_an_acting_on_lost_is_called_once_per_failure():
    asked = []
    j = LostHostJudge(0.0, watched=lambda: {"a"}, on_lost=lambda h, w: asked.append(h))
    j.answer(decisions(HEALTHY), 1, 0)
    j.answer(decisions(FAILED), 2, 0)
    run_judge(j, 0.5)
    assert asked == ["a"]


# -- the survivors' cut -------------------------------------------------------------


@pytest.fixture
def hang_ups(monkeypatch):
    from hvd_elastic.training._internal import gloo_hangup

    calls = []
    monkeypatch.setattr(gloo_hangup, "hang_up", lambda why="": calls.append(why) or [7])
    return calls


def test_the_cut_spares_a_failed_host_while_this_ranks_gloo_traffic_flows(hang_ups):
    from hvd_elastic.training._internal.health_cut import QUIET_S, HealthCut

    quiet = [0.01]
    cut = HealthCut("me", 1.0, quiet_for=lambda: quiet[0])
    cut.set_world(["me", "a", "b"])
    assert cut._cut("a", "ttl") is False and hang_ups == [], "a world that talks is not stuck"
    quiet[0] = QUIET_S + 0.5
    cut.between_worlds()  # so the hang-up's retries end at once
    cut.set_world(["me", "a", "b"])
    cut._left.set()
    assert cut._cut("a", "ttl") is True and len(hang_ups) == 1 and cut.cuts == ["a"]
    assert cut._cut("b", "ttl") is True and len(hang_ups) == 1, "one cut per world"


def test_the_cut_acts_when_it_cannot_see_gloo_and_never_for_a_host_outside_the_world(hang_ups):
    from hvd_elastic.training._internal.health_cut import HealthCut

    cut = HealthCut("me", 1.0, quiet_for=lambda: None)
    cut.set_world(["me", "a"])
    assert cut._cut("z", "ttl") is True and hang_ups == []
    assert cut._cut("me", "ttl") is True and hang_ups == [], "a rank never judges its own host"
    cut._left.set()
    assert cut._cut("a", "ttl") is True and len(hang_ups) == 1


# -- the reaper ---------------------------------------------------------------------

FAKE_HOROVODRUN = textwrap.dedent("""
    import os, subprocess, sys, time
    VAR = "HOROVOD_" + "HOSTNAME"  # never spelled out: this script is the middlemen's command line too
    # One middleman per worker, as horovod's safe_shell_exec forks them: own session, a shell under it.
    for host, local in (("hosta", False), ("hostb", False), ("hostb", True)):
        if os.fork() == 0:
            os.setsid()
            if local:  # a local worker: the shell execs the worker, whose environment names the host
                env = dict(os.environ, **{VAR: host})
                cmd = "exec sleep 300"
            else:  # a remote one: ssh's remote command carries the assignment
                env = dict(os.environ)
                cmd = f"sleep 300; : ssh {host} 'cd /x > /dev/null 2>&1 ; env {VAR}={host} HOROVOD_RANK=1 python t.py'"
            subprocess.Popen(["/bin/sh", "-c", cmd], env=env).wait()
            os._exit(0)
    # A discovery call: also a session under horovodrun, but no worker.
    if os.fork() == 0:
        os.setsid()
        os.execvp("sleep", ["sleep", "300"])
    print("ready", flush=True)
    time.sleep(300)
""")


@pytest.fixture
def fake_horovodrun():
    proc = subprocess.Popen([sys.executable, "-c", FAKE_HOROVODRUN], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        sessions = [child.pid for child in psutil.Process(proc.pid).children()]  # each leads its own session
        os.killpg(proc.pid, signal.SIGKILL)
        for sid in sessions:
            try:
                os.killpg(sid, signal.SIGKILL)
            except ProcessLookupError:  # the test ended it
                pass
        proc.wait()


def test_the_reaper_finds_horovodruns_worker_sessions_by_host(fake_horovodrun):
    sessions = wait_until("three worker sessions", lambda: (s := reaper.worker_sessions(fake_horovodrun.pid))
                          and sum(map(len, s.values())) == 3 and s, 10)
    assert sorted(sessions) == ["hosta", "hostb"] and len(sessions["hostb"]) == 2


def test_the_reaper_ends_only_the_lost_hosts_sessions(fake_horovodrun):
    wait_until("three worker sessions",
               lambda: sum(map(len, reaper.worker_sessions(fake_horovodrun.pid).values())) == 3, 10)
    r = reaper.Reaper(fake_horovodrun.pid, grace=0.0, answers=lambda sids: (False, "it is gone"))
    r.answer(decisions(entry("hosta"), entry("hostb")), 1, 0)
    r.answer(decisions(entry("hosta", check("_node_maintenance", "critical")),
                       entry("hostb", check("service:b", "critical", "TTL expired"))), 2, 0)
    for host, why in r.judge.due():
        r._reap(host, why)
    wait_until("hostb's sessions gone", lambda: "hostb" not in reaper.worker_sessions(fake_horovodrun.pid), 10)
    assert list(reaper.worker_sessions(fake_horovodrun.pid)) == ["hosta"], "a drained host keeps its workers"


@pytest.mark.parametrize("raw, expected", [("", True), ("0", False), ("true", True)])
def test_reaper_switch(raw, expected):
    assert reaper.enabled({reaper.ENV: raw}) is expected
    with pytest.raises(ConfigError, match="HVD_ELASTIC_HEALTH_REAP='maybe' is not a boolean"):
        reaper.enabled({reaper.ENV: "maybe"})


def test_the_reaper_leaves_a_lost_host_that_still_answers_and_asks_it_again_later(fake_horovodrun):
    wait_until("three worker sessions",
               lambda: sum(map(len, reaper.worker_sessions(fake_horovodrun.pid).values())) == 3, 10)
    now, probes, alive = [100.0], [], [True]
    r = reaper.Reaper(fake_horovodrun.pid, grace=0.0, clock=lambda: now[0],
                      answers=lambda sids: probes.append(sorted(sids)) or (alive[0], "probed"))
    hostb = sorted(reaper.worker_sessions(fake_horovodrun.pid)["hostb"])
    assert r._reap("hostb", "TTL expired") is False and probes == [hostb], "its node agent died, its workers live"
    now[0] += reaper.REPROBE_S / 2
    assert r._reap("hostb", "TTL expired") is False and len(probes) == 1, "not probed again so soon"
    now[0] += reaper.REPROBE_S
    alive[0] = False
    assert r._reap("hostb", "TTL expired") is True and len(probes) == 2
    wait_until("hostb's sessions gone", lambda: "hostb" not in reaper.worker_sessions(fake_horovodrun.pid), 10)
    assert r._reap("hostb", "TTL expired") is True and len(probes) == 2, "nothing left to end, nothing probed"


def test_both_sides_of_the_cut_are_on_by_default():
    from hvd_elastic.training import settings

    assert reaper.enabled({}) is True and settings.from_environment({}).health_cut is True
    assert reaper.enabled({reaper.ENV: "0"}) is False
    assert settings.from_environment({settings.HEALTH_CUT_ENV: "0"}).health_cut is False
