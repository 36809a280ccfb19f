"""One Consul of each kind for a module's tests (each test uses a run id of its own), and its parameters."""

from __future__ import annotations

import uuid

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters

from hvd_elastic.local.realconsul import KINDS, consul_cluster, unavailable_reason


@pytest.fixture(scope="module", params=KINDS)
def consul(request):
    if request.param == "consul" and (reason := unavailable_reason()):
        pytest.skip(reason)
    with consul_cluster(request.param, ["localhost"]) as cluster:
        yield cluster


def parameters(endpoint: str, run_id: str | None = None, min_nodes: int = 1, **conf) -> RendezvousParameters:
    return RendezvousParameters("consul", endpoint, run_id or f"t{uuid.uuid4().hex[:12]}", min_nodes, 3, **conf)
