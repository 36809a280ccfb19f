"""A token file rotated in place is followed by the long-running readers: the host-cache watcher.

The watcher lives as long as its job (days), so it is given the token FILE, not
the value, and reads it again for every request.  Real processes over real
HTTP: the dev agent with ACLs, a stand-in horovodrun, its watcher.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from consul_testing import clean_env, register

from hvd_elastic.local.realconsul import consul_cluster
from testbed import wait_until
from testbed.hostcache import StandInJob, fresh_record, kill_watchers

pytestmark = pytest.mark.slow

WAIT = 30  # seconds; hang guard for every wait below
TOKEN = f"mgmt-{uuid.uuid4().hex}"


def write_token(path: Path, token: str) -> None:
    """Replace the file's content atomically, as Vault Agent and consul-template do."""
    tmp = path.with_suffix(".new")
    tmp.write_text(token + "\n")
    tmp.chmod(0o600)
    os.replace(tmp, path)


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


@pytest.fixture
def state(tmp_path):
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700)
    yield directory
    kill_watchers(directory)


def test_the_watcher_gets_the_token_file_and_follows_its_rotation(tmp_path, state, consul_kind):
    token_file = tmp_path / "consul-token"
    write_token(token_file, TOKEN)
    with consul_cluster(consul_kind, ["localhost"], acl_token=TOKEN) as cluster:
        register(cluster.addr("localhost"), slots="2", token=TOKEN)
        env = clean_env(state, CONSUL_HTTP_ADDR=cluster.addr("localhost"), HVD_ELASTIC_DISCOVERY_CACHE="on",
                        HVD_ELASTIC_DISCOVERY_WATCH_WAIT="1", CONSUL_HTTP_TOKEN_FILE=str(token_file))
        with StandInJob(env) as job:
            first = job.discover()
            assert (first.returncode, first.stdout) == (0, "localhost:2\n"), first.stderr
            record = wait_until("the watcher's first answer", lambda: fresh_record(state), WAIT)

            watcher_env = environ_of(record.pid)
            assert watcher_env.get("CONSUL_HTTP_TOKEN_FILE") == str(token_file)
            assert "CONSUL_HTTP_TOKEN" not in watcher_env
            assert TOKEN not in Path(f"/proc/{record.pid}/environ").read_text()

            # Revoked and replaced: the watcher's next request uses the new (here: unknown) token,
            # fails with 403, and it stops vouching for the cache; the calls then ask Consul directly.
            write_token(token_file, "revoked-" + TOKEN)
            wait_until("the watcher to notice the rotated token", lambda: fresh_record(state) is None, WAIT)
            refused = job.discover()
            assert (refused.returncode, refused.stdout) == (1, ""), refused
            assert "403" in refused.stderr

            write_token(token_file, TOKEN)
            wait_until("the watcher to vouch again", lambda: fresh_record(state), WAIT)
            assert job.discover().stdout == "localhost:2\n"
