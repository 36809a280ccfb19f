"""``hvd-elastic status`` takes discovery's flags but refuses the host cache's, which it would ignore.

Before, ``status --watch`` (or ``--cache off``, ``--cache-file PATH``...) parsed and did nothing of
the kind, so a user believed they had watched or bypassed a cache; now each is one stderr line
naming the flag, exit 2, like every other bad input.
"""

from __future__ import annotations

import subprocess

import pytest
from consul_testing import clean_env, register

from testbed import HVD_ELASTIC


def status(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(HVD_ELASTIC), "status", *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args, flag", [
    (["--watch"], "--watch"), (["--cache", "off"], "--cache"), (["--cache=on"], "--cache"),
    (["--cache-file", "/tmp/hosts.cache"], "--cache-file"), (["--watch-wait", "5"], "--watch-wait"),
    (["--cache-max-age", "5"], "--cache-max-age"), (["--service", "horovod", "--watch", "--timeout", "1"], "--watch"),
])
def test_cache_flags_are_refused_with_one_line_and_exit_2(tmp_path, args, flag):
    result = status(clean_env(tmp_path, CONSUL_HTTP_ADDR="127.0.0.1:1"), *args)
    assert result.returncode == 2, result
    assert result.stdout == ""
    assert result.stderr == (f"hvd-elastic status: error: {flag} is a host-cache flag of "
                             f"`hvd-elastic discover`; status reads no cache (it always asks Consul): drop it\n")


def test_status_still_takes_discovery_flags_and_shows_the_service(cluster, tmp_path):
    register(cluster.addr("localhost"), slots="4")
    result = status(clean_env(tmp_path, CONSUL_HTTP_ADDR=cluster.addr("localhost")),
                    "--service", "horovod", "--timeout", "5", "--max-slots-per-host", "8")
    assert result.returncode == 0, result
    assert "discovery prints (1 hosts, 4 slots):\n  localhost:4\n" in result.stdout
