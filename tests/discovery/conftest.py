"""Fixtures of the discovery tests: a two-node Consul cluster (the dev agent, then real Consul)."""

from __future__ import annotations

import pytest

from hvd_elastic.local.realconsul import consul_cluster


@pytest.fixture
def cluster(consul_kind):
    """Consul (dev agent, then real Consul) with the two local horovodrun hosts as nodes, each its own agent."""
    with consul_cluster(consul_kind, ["localhost", "127.0.0.1"]) as c:
        yield c
