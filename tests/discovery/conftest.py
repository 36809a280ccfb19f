"""Fixtures of the discovery tests: a two-node dev Consul cluster and a clean child environment."""

from __future__ import annotations

import pytest

from hvd_elastic.devagent import DevCluster


@pytest.fixture
def cluster():
    """Dev Consul with the two local horovodrun hosts as nodes, each with its own agent port."""
    with DevCluster(nodes=["localhost", "127.0.0.1"]) as c:
        yield c
