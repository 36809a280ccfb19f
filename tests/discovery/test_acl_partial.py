"""Discovery with a token that may read only part of the catalog: never a partial host list.

Consul drops the rows a token may not read and says so with
``X-Consul-Results-Filtered-By-ACLs: true``; what is left would be a host
list missing healthy hosts, so discovery must print nothing and fail.  Real
processes over real HTTP: the dev agent with a restricted token (node_prefix
"localhost" read only) and the discovery script as horovodrun runs it.
"""

from __future__ import annotations

import uuid

import pytest
from consul_testing import clean_env, register, run_discovery

from hvd_elastic.devagent import DevCluster

ADMIN = f"admin-{uuid.uuid4().hex}"
READER = f"reader-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def partial():
    """Hosts localhost (2 slots) and 127.0.0.1 (1 slot); the reader may read node "localhost" only."""
    with DevCluster(nodes=["localhost", "127.0.0.1"], acl_token=ADMIN, restricted_token=READER,
                    restricted_node_prefixes=["localhost"], restricted_service_prefixes=["horovod"]) as cluster:
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
