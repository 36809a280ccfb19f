"""Discovery with a token that may read only part of the catalog: never a partial host list.

Consul drops the rows a token may not read and says so with
``X-Consul-Results-Filtered-By-ACLs: true``; what is left would be a host
list missing healthy hosts, so discovery must print nothing and fail.  Real
processes over real HTTP: a restricted token (node_prefix "localhost" read
only) and the discovery script as horovodrun runs it.

HashiCorp Consul 1.8.7 filters the same rows but does not send the header
(:func:`test_consul_1_8_7_filters_without_saying_so`), so there a token that
may not read every node yields a partial list that nothing can tell from a
whole one: the difference table in :mod:`hvd_elastic.devagent` and README's
ACL section say which rules the token needs.
"""

from __future__ import annotations

import dataclasses
import time
import uuid

import pytest
from consul_testing import clean_env, register, run_discovery

from hvd_elastic.consul import client
from hvd_elastic.consul.config import ConsulConfig
from hvd_elastic.local.realconsul import consul_cluster, unavailable_reason

ADMIN = f"admin-{uuid.uuid4().hex}"
READER = str(uuid.uuid4())  # Consul wants a UUID as a token's secret
FILTERED = "x-consul-results-filtered-by-acls"


def restricted(kind: str):
    """Hosts localhost (2 slots) and 127.0.0.1 (1 slot); the reader may read node "localhost" only."""
    return consul_cluster(kind, ["localhost", "127.0.0.1"], acl_token=ADMIN, restricted_token=READER,
                          restricted_node_prefixes=["localhost"], restricted_service_prefixes=["horovod"])


@pytest.fixture(scope="module")
def partial():
    with restricted("dev") as cluster:
        register(cluster.addr("localhost"), slots="2", token=ADMIN)
        register(cluster.addr("127.0.0.1"), slots="1", token=ADMIN)
        yield cluster


def discover(cluster, tmp_path, token: str):
    path = tmp_path / "consul-token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    # No host cache: these calls start no watcher that could outlive the test.
    env = clean_env(tmp_path, CONSUL_HTTP_ADDR=cluster.addr("localhost"), HVD_ELASTIC_DISCOVERY_CACHE="off",
                    CONSUL_HTTP_TOKEN_FILE=str(path))
    return run_discovery(env)


def test_a_partly_hidden_answer_prints_nothing_and_fails(partial, tmp_path):
    result = discover(partial, tmp_path, READER)
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""  # never "localhost:2" alone
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "X-Consul-Results-Filtered-By-ACLs" in lines[0], result.stderr
    assert READER not in result.stderr


def test_the_full_token_gets_the_complete_list(partial, tmp_path):
    result = discover(partial, tmp_path, ADMIN)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert sorted(result.stdout.splitlines()) == ["127.0.0.1:1", "localhost:2"]


def test_consul_1_8_7_filters_without_saying_so(tmp_path):
    """The difference that stays: real Consul 1.8.7 drops the unreadable rows and sends no header about it."""
    if reason := unavailable_reason():
        pytest.skip(reason)
    with restricted("consul") as cluster:
        register(cluster.addr("localhost"), slots="2", token=ADMIN)
        register(cluster.addr("127.0.0.1"), slots="1", token=ADMIN)
        host, port = cluster.addr("localhost").rsplit(":", 1)
        as_admin = ConsulConfig(host=host, port=int(port), token=ADMIN)
        for _ in range(50):  # the second node's registration reaches the server's catalog a moment later
            if len(client.get_json(as_admin, "/v1/health/service/horovod")) == 2:
                break
            time.sleep(0.1)
        rows, headers = client.request(dataclasses.replace(as_admin, token=READER), "/v1/health/service/horovod")
        assert [r["Node"]["Node"] for r in rows] == ["localhost"]
        assert FILTERED not in headers, headers
        result = discover(cluster, tmp_path, READER)
    assert (result.returncode, result.stdout) == (0, "localhost:2\n"), (result.returncode, result.stdout, result.stderr)
