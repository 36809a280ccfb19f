"""Fixtures for the dev agent's tests: a running DevCluster and clients that talk to it over HTTP."""

from __future__ import annotations

import consul
import pytest

from devagent_helpers import Raw, client

from hvd_elastic.devagent import DevCluster


@pytest.fixture(autouse=True)
def _no_consul_env(monkeypatch):
    # py-consul reads CONSUL_HTTP_* itself (the token even overrides token=); tests must not inherit them.
    for name in ("CONSUL_HTTP_ADDR", "CONSUL_HTTP_TOKEN", "CONSUL_HTTP_SSL", "CONSUL_HTTP_SSL_VERIFY",
                 "CONSUL_HTTP_TOKEN_FILE", "CONSUL_CACERT"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def cluster():
    """Two nodes with a shortened reaper and session TTL floor, shared by one test module.

    Tests in a module share it, so each uses its own service names and keys.
    """
    with DevCluster(nodes=["gpu-a", "gpu-b"], reap_interval=0.5, deregister_critical_min=1.0,
                    session_ttl_min=1.0) as c:
        yield c


@pytest.fixture
def c(cluster) -> consul.Consul:
    return client(cluster)


@pytest.fixture
def raw(cluster) -> Raw:
    return Raw(cluster.addr("gpu-a"))
