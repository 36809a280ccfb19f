"""Unit tests of the host cache: file format and trust rules, cache keys, the blocking-query loop's index rules."""

from __future__ import annotations

import os
import threading
import time

import pytest

from hvd_elastic.discovery import cache, cachekey, jobdir, watch
from hvd_elastic.health.hosts import evaluate
from hvd_elastic.health.watch import follow
from hvd_elastic.consul.client import ConsulError

ME = (os.getpid(), jobdir.proc_stat(os.getpid())[1])


def record(**overrides) -> cache.Record:
    fields = dict(key="k1", pid=ME[0], started=ME[1], max_age=10.0, answered=time.monotonic(), wall=time.time(),
                  index=42, hosts=b"a:1\nb:2\n", warnings=b"discover: dropping instance 'x' on node 'n': bad\n")
    fields.update(overrides)
    return cache.Record(**fields)


def test_round_trip_keeps_hosts_warnings_and_meta(tmp_path):
    path = str(tmp_path / "hosts")
    cache.write(path, record())
    rec = cache.load(path, "k1", (os.getuid(),))
    assert (rec.hosts, rec.index, rec.pid, rec.error) == (b"a:1\nb:2\n", 42, ME[0], "")
    assert rec.warnings.startswith(b"discover: dropping")
    assert cache.untrusted_reason(rec) is None
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["hosts"]  # no temp file left


def test_missing_file_is_no_record(tmp_path):
    assert cache.load(str(tmp_path / "none"), "k1", (os.getuid(),)) is None


@pytest.mark.parametrize(
    "damage,needle",
    [
        (lambda data: data[:-3], "truncated or corrupt"),
        (lambda data: data[:40], "not a host cache file"),
        (lambda data: data.replace(b"a:1", b"x:9"), "truncated or corrupt"),
        (lambda data: b'{"hosts": ["a:1"]}', "not a host cache file"),
        (lambda data: data.replace(b"index 42", b"index forty"), "header is malformed"),
        (lambda data: data.replace(b"key k1", b"key k2"), "other discovery settings"),
        (lambda data: b"", "not a host cache file"),
    ],
)
def test_corrupt_truncated_and_foreign_files_are_refused(tmp_path, damage, needle):
    path = tmp_path / "hosts"
    cache.write(str(path), record())
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(cache.CacheInvalid, match=needle):
        cache.load(str(path), "k1", (os.getuid(),))


def test_files_others_may_write_or_own_are_refused(tmp_path):
    path = tmp_path / "hosts"
    cache.write(str(path), record())
    os.chmod(path, 0o620)
    with pytest.raises(cache.CacheInvalid, match="other users may write it"):
        cache.load(str(path), "k1", (os.getuid(),))
    os.chmod(path, 0o600)
    with pytest.raises(cache.CacheInvalid, match="belongs to uid"):
        cache.load(str(path), "k1", (os.getuid() + 1,))
    link = tmp_path / "link"
    link.symlink_to(path)
    with pytest.raises(cache.CacheInvalid, match="cannot be opened"):
        cache.load(str(link), "k1", (os.getuid(),))


def test_a_valid_file_is_untrusted_when_stale_failed_or_its_watcher_is_gone():
    assert "freshness bound" in cache.untrusted_reason(record(answered=time.monotonic() - 11))
    assert "last request failed: 503" in cache.untrusted_reason(record(error="503"))
    assert "is gone" in cache.untrusted_reason(record(started="1"))  # our pid, another start time: pid reused
    assert "future" in cache.untrusted_reason(record(answered=time.monotonic() + 60))


def test_keys_mask_tokens_and_cover_flags_and_environment():
    env = {"CONSUL_HTTP_ADDR": "127.0.0.1:8500", "CONSUL_HTTP_TOKEN": "s3cret", "PATH": "/bin"}
    base = cachekey.raw_key(["--tag", "a"], env)
    assert cachekey.raw_key(["--tag", "a"], dict(env, CONSUL_HTTP_TOKEN="other")) == base  # token values never enter
    assert cachekey.raw_key(["--tag", "a"], dict(env, PATH="/usr/bin")) == base  # unrelated variables do not
    assert cachekey.raw_key(["--tag", "b"], env) != base
    assert cachekey.raw_key(["--tag", "a"], dict(env, HVD_ELASTIC_FILTER="x")) != base
    assert cachekey.raw_key(["--tag", "a"], dict(env, CONSUL_HTTP_ADDR="127.0.0.1:8501")) != base
    assert cachekey.mask_tokens(["--token", "s3cret", "--tok=s3cret", "--token-file", "/t", "--tag", "x"]) == [
        "--token", cachekey.MASK, "--tok=" + cachekey.MASK, "--token-file", "/t", "--tag", "x"]


def test_a_watcher_gets_no_token_on_its_command_line():
    argv = ["--token", "s3cret", "--tag", "x", "--token-file=/t", "--toke", "s3cret", "--token-file", "/u",
            "--filter", "y"]
    assert cachekey.without_token_flags(argv) == ["--tag", "x", "--filter", "y"]


def entry(node: str) -> dict:
    return {"Node": {"Node": node, "Address": "10.0.0.1"}, "Service": {"ID": node, "Meta": {"slots": "1"}},
            "Checks": []}


def test_follow_blocks_on_each_index_resets_after_failures_and_backwards_indexes(tmp_path):
    """The loop's requests and the file it leaves, against a scripted Consul."""
    script = [(["a"], 5), (["a"], 5), (["a", "b"], 9), ConsulError("unreachable", retryable=True),
              (["b"], 4), (["b"], 2)]
    asked: list[int] = []
    stop = threading.Event()
    publisher = watch.Publisher(str(tmp_path / "hosts"), "k", 60.0, 0o600)
    states: list[tuple[str, bytes]] = []

    def fetch(index: int):
        asked.append(index)
        if len(asked) > len(script):
            stop.set()
            raise ConsulError("done", retryable=True)
        step = script[len(asked) - 1]
        if len(asked) > 1:
            rec = cache.parse((tmp_path / "hosts").read_bytes())
            states.append((rec.error, rec.hosts))
        if isinstance(step, Exception):
            raise step
        nodes, index_back = step
        return evaluate([entry(n) for n in nodes]), index_back, time.monotonic()

    follow(fetch, publisher, stop, (ConsulError,))
    # Plain read, block on 5 twice (no change is no reason to stop), on 9, then a plain read after the
    # failure, block on 4, and a plain read again once the index went backwards (2 < 4).
    assert asked == [0, 5, 5, 9, 0, 4, 0]
    assert states[2] == ("", b"a:1\nb:1\n")
    assert states[3][0] == "unreachable"  # the failure was published before the retry
    assert states[4] == ("", b"b:1\n")


def test_a_publisher_whose_directory_vanished_reports_broken_instead_of_raising(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    publisher = watch.Publisher(str(gone / "hosts"), "k", 60.0, 0o600)
    gone.rmdir()
    publisher.answer(evaluate([entry("a")]), 3, time.monotonic())
    assert publisher.broken.is_set()


def test_the_warm_path_imports_no_heavy_module():
    """discovery's warm path runs every second: a stray ``typing``/``argparse``/``json`` import there
    cost it 70% once (``benchmarks/discovery_speed.py`` measures the time; this names the culprit)."""
    import subprocess
    import sys

    from testbed import REPO

    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import hvd_elastic.discovery.fast; "
             "print(' '.join(sorted(m for m in "
             "('typing', 'argparse', 'json', 'logging', 're', 'socket', 'dataclasses') "
             "if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", probe, str(REPO)], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.split() == [], f"the warm path imports {out.stdout.strip()}"
