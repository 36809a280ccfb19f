"""One Consul of each kind for a module's tests (each test uses a run id of its own)."""

from __future__ import annotations

import pytest

from hvd_elastic.local.realconsul import KINDS, consul_cluster, unavailable_reason


@pytest.fixture(scope="module", params=KINDS)
def consul(request):
    if request.param == "consul" and (reason := unavailable_reason()):
        pytest.skip(reason)
    with consul_cluster(request.param, ["localhost"]) as cluster:
        yield cluster
