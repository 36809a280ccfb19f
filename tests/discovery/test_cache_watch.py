"""The host cache with real processes: a stand-in horovodrun, its watcher, the dev agent over HTTP.

Each test asserts outcomes and their order; every wait is bounded (a hang
guard, not a speed target: speed is in benchmarks/discovery_*.py).  Whatever a
test starts is stopped in its fixtures, also on failure.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from testbed.hostcache import (
    CountingProxy,
    StandInJob,
    cache_files,
    fresh_record,
    kill_watchers,
    pid_alive,
    read_record,
)
from consul_testing import clean_env, consul_request, register, run_discovery

from hvd_elastic.local.realconsul import consul_cluster
from hvd_elastic.discovery import cache
from testbed import HVD_ELASTIC, child_env, start_dev_agent, wait_until

pytestmark = pytest.mark.slow

WAIT = 30  # seconds; hang guard for every wait below


@pytest.fixture
def state(tmp_path):
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700)
    yield directory
    kill_watchers(directory)  # normally gone with their job already; never left behind by a failing test


@pytest.fixture
def jobs():
    started: list[StandInJob] = []

    def start(env: dict[str, str]) -> StandInJob:
        started.append(StandInJob(env))
        return started[-1]

    yield start
    for job in started:
        job.kill()


def cache_env(state: Path, addr: str, **extra: str) -> dict[str, str]:
    return clean_env(state, CONSUL_HTTP_ADDR=addr, HVD_ELASTIC_DISCOVERY_CACHE="on", **extra)


def warm(job: StandInJob, state: Path, *args: str):
    """The job's first call (direct), then its watcher's first answer; returns that record."""
    first = job.discover(*args)
    assert first.returncode == 0, first.stderr
    return wait_until("the watcher's first answer", lambda: fresh_record(state), WAIT)


def assert_one_line_failure(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert (result.returncode, result.stdout) == (1, ""), result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and all(n in lines[0] for n in needles), result.stderr


def test_cache_follows_joins_drains_and_leaves_without_direct_queries(cluster, state, jobs):
    local, other = cluster.addr("localhost"), cluster.addr("127.0.0.1")
    register(local, slots="4")
    register(local, "bad", slots="two")
    with CountingProxy(local) as proxy:
        job = jobs(cache_env(state, proxy.addr))
        first = job.discover()
        assert (first.returncode, first.stdout) == (0, "localhost:4\n") and "'two'" in first.stderr
        wait_until("the watcher's first answer", lambda: fresh_record(state), WAIT)
        plain_reads = len(proxy.health(blocking=False))  # the first call's and the watcher's own

        cached = job.discover()
        assert (cached.returncode, cached.stdout) == (0, "localhost:4\n")
        assert "'two'" in cached.stderr  # dropped-instance warnings come with the cached answer
        register(other, slots="2")
        wait_until("the join", lambda: job.discover().stdout == "127.0.0.1:2\nlocalhost:4\n", WAIT)
        consul_request(other, "PUT", "/v1/agent/service/maintenance/horovod?enable=true&reason=drain")
        wait_until("the drain", lambda: job.discover().stdout == "localhost:4\n", WAIT)
        consul_request(other, "PUT", "/v1/agent/service/maintenance/horovod?enable=false")
        wait_until("the undrain", lambda: job.discover().stdout == "127.0.0.1:2\nlocalhost:4\n", WAIT)
        consul_request(other, "PUT", "/v1/agent/service/deregister/horovod")
        wait_until("the leave", lambda: job.discover().stdout == "localhost:4\n", WAIT)

        # Every call after the first was answered from the cache: no more plain reads, only blocking ones.
        assert len(proxy.health(blocking=False)) == plain_reads
        assert len(proxy.health(blocking=True)) >= 4
    assert len(cache_files(state)) == 1  # one watcher, one file, for the whole job


def test_a_killed_watcher_is_never_trusted_and_is_replaced(cluster, state, jobs):
    local, other = cluster.addr("localhost"), cluster.addr("127.0.0.1")
    register(local, slots="4")
    register(other, slots="2")
    job = jobs(cache_env(state, local))
    old = warm(job, state)
    os.kill(old.pid, signal.SIGKILL)
    wait_until("the watcher to die", lambda: not pid_alive(old.pid), WAIT)
    consul_request(other, "PUT", "/v1/agent/service/deregister/horovod")
    assert b"127.0.0.1:2" in read_record(cache_files(state)[0]).hosts  # the dead watcher's file still lists it

    after = job.discover()
    assert (after.returncode, after.stdout, after.stderr) == (0, "localhost:4\n", "")  # asked Consul instead
    new = wait_until("a new watcher", lambda: (r := fresh_record(state)) and r.pid != old.pid and r, WAIT)
    assert new.hosts == b"localhost:4\n"


def test_a_stale_cache_is_never_trusted(cluster, state, jobs):
    local, other = cluster.addr("localhost"), cluster.addr("127.0.0.1")
    register(local, slots="4")
    register(other, slots="2")
    args = ("--watch-wait", "1", "--cache-max-age", "3")
    job = jobs(cache_env(state, local))
    rec = warm(job, state, *args)
    path = cache_files(state)[0]
    os.kill(rec.pid, signal.SIGSTOP)  # a frozen watcher: alive, holding its lock, writing nothing
    try:
        consul_request(other, "PUT", "/v1/agent/service/deregister/horovod")
        wait_until("the cache to outlive its freshness bound",
                   lambda: "freshness bound" in (cache.untrusted_reason(read_record(path)) or ""), WAIT)
        stale = job.discover(*args)
        assert (stale.returncode, stale.stdout) == (0, "localhost:4\n")  # the direct answer, not the frozen list
    finally:
        os.kill(rec.pid, signal.SIGCONT)
    thawed = wait_until("the thawed watcher's answer",
                        lambda: (r := fresh_record(state)) and r.hosts == b"localhost:4\n", WAIT)
    assert thawed and job.discover(*args).stdout == "localhost:4\n"


def test_consul_outage_and_return(cluster, state, jobs):
    local = cluster.addr("localhost")
    register(local, slots="4")
    # Updated once, as a node agent does: Consul brings a TTL check back from a restart only so.
    consul_request(local, "PUT", "/v1/agent/check/pass/service:horovod")
    job = jobs(cache_env(state, local))
    warm(job, state)
    path = cache_files(state)[0]
    cluster.stop_node("localhost")
    try:
        wait_until("the watcher to report the outage", lambda: (r := read_record(path)) and r.error, WAIT)
        assert_one_line_failure(job.discover(), "cannot reach Consul")  # not the cached list
    finally:
        cluster.start_node("localhost")
    wait_until("the watcher to recover", lambda: fresh_record(state), WAIT)
    assert job.discover().stdout == "localhost:4\n"


def test_agent_restart_with_a_lower_index(tmp_path, state, jobs):
    """The watcher re-reads at once instead of parking on an index the new agent has not reached."""
    args = ("--host-name", "service-address")
    agent, addresses = start_dev_agent(["localhost"], env=child_env(), logdir=tmp_path)
    try:
        addr = addresses["localhost"]
        for i in range(1, 4):
            register(addr, f"i{i}", address=f"10.0.0.{i}")
        for n in range(20):  # move the index well past what the restarted agent will reach
            consul_request(addr, "PUT", "/v1/agent/check/update/service:i1", {"Status": "passing", "Output": str(n)})
        job = jobs(cache_env(state, addr))
        before = warm(job, state, *args)
        assert before.hosts == b"10.0.0.1:1\n10.0.0.2:1\n10.0.0.3:1\n" and before.index > 20
        agent.kill()
        agent, _ = start_dev_agent(["localhost"], env=child_env(), logdir=tmp_path, name="consul-dev-again",
                                   port=int(addr.rsplit(":", 1)[1]))
        register(addr, "i9", address="10.0.0.9")
        # The default wait is 60 s: well inside it, the cache shows the new agent's state.
        after = wait_until("the cache to follow the restarted agent",
                           lambda: (r := fresh_record(state)) and r.hosts == b"10.0.0.9:1\n" and r, WAIT)
        assert after.index < before.index
        assert job.discover(*args).stdout == "10.0.0.9:1\n"
    finally:
        agent.kill()


def test_the_watcher_exits_with_its_job(cluster, state, jobs):
    register(cluster.addr("localhost"), slots="4")
    job = jobs(cache_env(state, cluster.addr("localhost")))
    rec = warm(job, state)
    path = cache_files(state)[0]
    job.kill()
    wait_until("the watcher to exit", lambda: not pid_alive(rec.pid), WAIT)
    assert not path.exists() and not Path(f"{path}.lock").exists()  # it removed its cache on the way out


def test_broken_or_foreign_cache_files_are_ignored_with_a_warning(cluster, state, jobs):
    register(cluster.addr("localhost"), slots="4")
    job = jobs(cache_env(state, cluster.addr("localhost")))
    warm(job, state)
    path = cache_files(state)[0]
    good = path.read_bytes()
    damages = {
        "truncated": lambda: path.write_bytes(good[:-4]),
        "garbage": lambda: path.write_bytes(b"\x00\xffnot a cache\n"),
        "other settings": lambda: path.write_bytes(good.replace(b"key ", b"key 0", 1)),
        "writable by others": lambda: (path.write_bytes(good), path.chmod(0o622)),
    }
    if os.getuid() == 0:
        damages["owned by another user"] = lambda: (path.chmod(0o600), os.chown(path, 4242, -1))
    for what, damage in damages.items():
        damage()
        result = job.discover()
        assert (result.returncode, result.stdout) == (0, "localhost:4\n"), what  # from Consul, not the file
        assert "ignoring the host cache" in result.stderr, (what, result.stderr)
    # The lone watcher rewrites its file at the next answer; meanwhile put it back.
    os.chown(path, os.getuid(), -1)
    path.chmod(0o600)
    path.write_bytes(good)
    assert job.discover().stderr == ""


def test_an_operator_watch_serves_discovery_with_the_same_settings_only(cluster, state, tmp_path, jobs):
    local = cluster.addr("localhost")
    register(local, slots="4", tags=["gpu"])
    shared = tmp_path / "run"
    shared.mkdir()
    cache_file = shared / "horovod.hosts"
    with CountingProxy(local) as proxy:
        env = clean_env(state, CONSUL_HTTP_ADDR=proxy.addr)
        watcher = subprocess.Popen([str(HVD_ELASTIC), "discover", "--watch", "--cache-file", str(cache_file)],
                                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
        try:
            wait_until("the operator's cache", lambda: (r := read_record(cache_file)) and not r.error, WAIT)
            assert cache_file.stat().st_mode & 0o777 == 0o644  # readable by the users whose jobs read it
            plain_reads = len(proxy.health(blocking=False))
            job = jobs(env)
            for _ in range(3):
                result = job.discover("--cache-file", str(cache_file))
                assert (result.returncode, result.stdout, result.stderr) == (0, "localhost:4\n", "")
            assert len(proxy.health(blocking=False)) == plain_reads  # all three from the file
            # The job's first read checked the settings and left an alias: later reads skip flag parsing.
            aliases = list(state.glob("*/hosts-*.alias"))
            assert len(aliases) == 1 and aliases[0].read_text().startswith(f"{cache_file}\nsettings-")
            other = run_discovery(env, "--cache-file", str(cache_file), "--tag", "cpu")
            assert other.stdout == "" and "written for other discovery settings" in other.stderr
            os.killpg(watcher.pid, signal.SIGTERM)
            assert watcher.wait(timeout=WAIT) == 0
            assert not cache_file.exists()
            after = job.discover("--cache-file", str(cache_file))
            assert (after.returncode, after.stdout) == (0, "localhost:4\n")  # no cache: the direct query
            assert len(proxy.health(blocking=False)) > plain_reads
        finally:
            if watcher.poll() is None:
                os.killpg(watcher.pid, signal.SIGKILL)
                watcher.wait()
            watcher.stderr.close()


@pytest.mark.dev_agent_only("a follower's X-Consul-LastContact lag is set on the dev agent; one real server has none")
def test_stale_reads_are_bounded_by_last_contact(cluster, state, jobs):
    local, other = cluster.addr("localhost"), cluster.addr("127.0.0.1")
    register(local, slots="4")
    cluster.set_stale_lag(200)
    job = jobs(cache_env(state, local))
    rec = warm(job, state, "--stale", "--max-stale", "2")
    assert rec.hosts == b"localhost:4\n"
    cluster.set_stale_lag(9000)  # the follower fell 9 s behind its leader
    register(other, slots="2")  # a change wakes the watcher, whose answer is now too stale
    path = cache_files(state)[0]
    wait_until("the watcher to refuse the stale answer",
               lambda: "behind its leader" in (read_record(path).error or ""), WAIT)
    assert_one_line_failure(job.discover("--stale", "--max-stale", "2"), "9 s behind its leader")
    cluster.set_stale_lag(0)
    wait_until("the watcher to recover",
               lambda: (r := fresh_record(state)) and r.hosts == b"127.0.0.1:2\nlocalhost:4\n", WAIT)


def test_tokens_never_reach_cache_files_logs_or_command_lines(tmp_path, state, jobs, consul_kind):
    secret = "s3cret-t0ken"
    with consul_cluster(consul_kind, ["localhost"], acl_token=secret) as secured:
        addr = secured.addr("localhost")
        register(addr, slots="2", token=secret)
        job = jobs(cache_env(state, addr))
        assert job.discover("--token", secret).stdout == "localhost:2\n"
        rec = wait_until("the watcher's first answer", lambda: fresh_record(state), WAIT)
        assert job.discover("--token", secret).stdout == "localhost:2\n"
        cmdline = Path(f"/proc/{rec.pid}/cmdline").read_bytes()
        assert b"--watch" in cmdline and secret.encode() not in cmdline
        for path in state.rglob("*"):
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), path


def test_the_operator_watcher_serves_its_metrics(cluster, state, tmp_path, jobs):
    """``--watch --metrics-addr``: answers, failures by kind, the cache's age and validity, calls by source."""
    from testbed import ports, prometheus
    from prometheus_client.parser import text_string_to_metric_families

    local = cluster.addr("localhost")
    register(local, slots="4")
    cache_file = tmp_path / "horovod.hosts"
    port = ports.reserve()[0]
    env = clean_env(state, CONSUL_HTTP_ADDR=local)
    watcher = subprocess.Popen([str(HVD_ELASTIC), "discover", "--watch", "--cache-file", str(cache_file),
                                "--metrics-addr", f"127.0.0.1:{port}"],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)

    def scrape() -> tuple[bytes, dict[str, float]]:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            body = answer.read()
        values = {}
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return body, values

    try:
        wait_until("the operator's cache", lambda: (r := read_record(cache_file)) and not r.error, WAIT)
        for source in ("cache", "direct"):  # every job's user may count, whoever owns the folder
            assert Path(f"{cache_file}.answers-{source}").stat().st_mode & 0o777 == 0o666
        job = jobs(env)
        for _ in range(3):
            assert job.discover("--cache-file", str(cache_file)).stdout == "localhost:4\n"
        other = run_discovery(env, "--cache-file", str(cache_file), "--tag", "cpu")  # other settings: a direct query
        assert other.returncode == 0 and "written for other discovery settings" in other.stderr
        body, values = scrape()
        assert values["hvd_elastic_discovery_calls_total{answer=cache}"] == 3
        assert values["hvd_elastic_discovery_calls_total{answer=direct}"] == 1
        assert values["hvd_elastic_discovery_hosts"] == 1 and values["hvd_elastic_discovery_cache_valid"] == 1
        assert values["hvd_elastic_discovery_consul_answers_total"] >= 1
        assert 0 <= values["hvd_elastic_discovery_cache_age_seconds"] < 70  # the blocking query's 60 s wait + slack
        if prometheus.unavailable_reason() is None:
            check = prometheus.check_metrics(body)
            assert check.returncode == 0 and not check.stdout.strip(), check.stdout
        cluster.stop_node("localhost")  # Consul's agent gone: the watcher's read fails, the cache is invalid
        wait_until("a failure counted", lambda: scrape()[1]["hvd_elastic_discovery_cache_valid"] == 0, WAIT)
        assert scrape()[1]["hvd_elastic_discovery_consul_errors_total{kind=unreachable}"] >= 1
        cluster.start_node("localhost")
        wait_until("the watcher's recovery", lambda: scrape()[1]["hvd_elastic_discovery_cache_valid"] == 1, 60)
        os.killpg(watcher.pid, signal.SIGTERM)
        assert watcher.wait(timeout=WAIT) == 0
        assert not list(tmp_path.glob("horovod.hosts*")), list(tmp_path.iterdir())  # counts removed with the cache
    finally:
        if watcher.poll() is None:
            os.killpg(watcher.pid, signal.SIGKILL)
            watcher.wait()
        watcher.stderr.close()
