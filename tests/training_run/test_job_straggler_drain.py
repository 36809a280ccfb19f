"""The job's half of a straggler drain (``training/_internal/straggler_drain.py``, rank 0): which host, within which
limits, and the request written to Consul for every instance of the service on that host (both Consul kinds)."""

from __future__ import annotations

import uuid

import pytest

from hvd_elastic.health import stragglers, variables
from hvd_elastic.local.realconsul import consul_cluster
from hvd_elastic.training._internal import pace, rendezvous
from hvd_elastic.training._internal.straggler_drain import FAILED, REFUSED, REQUESTED, SKIPPED, Drainer, choose, limit
from testbed.consul import consul_request, register

POLICY = pace.PacePolicy(mode="drain", window=20, windows=3)
ADMIN = f"admin-{uuid.uuid4().hex}"
WRITER_OF_NOTHING = str(uuid.uuid4())  # reads the service, may write no key


def slow(host: str = "127.0.0.1", ratio: float = 3.0, ranks: int = 1) -> pace.HostPace:
    return pace.HostPace(host, 0.3, ratio, ranks, True)


class Driver:
    """horovodrun's driver as the drainer sees it: its forming world's ``min_np``."""

    def __init__(self, min_np: int | None):
        self.min_np = min_np

    def world(self) -> rendezvous.World:
        return rendezvous.World(("localhost", "127.0.0.1"), frozenset(), "", self.min_np)


def test_the_slowest_new_straggler_is_chosen():
    assert choose([]) is None
    assert choose([slow("a", 2.0), slow("b", 3.5), slow("c", 1.7)]).host == "b"


@pytest.mark.parametrize("size,hosts,min_np,why", [
    (3, 2, 2, None),
    (3, 1, 1, "it is the only host of the job"),
    (3, 2, None, "horovodrun's --min-np is unknown (a horovodrun without hvd-elastic's driver rules)"),
    (3, 2, 3, "the job would keep 2 of 3 ranks, below --min-np 3"),
])
def test_limits(size, hosts, min_np, why):
    assert limit(slow(), size, hosts, min_np) == why


def test_a_driver_without_the_rules_means_no_drain():
    outcome = Drainer(server=lambda: None).drain(slow(), 0.1, 3, 2, POLICY)
    assert outcome.status == SKIPPED and "--min-np is unknown" in outcome.why


def ask(cluster, monkeypatch, tmp_path, token: str | None = None, min_np: int | None = 2):
    monkeypatch.setenv("CONSUL_HTTP_ADDR", cluster.addr("localhost"))
    if token:
        (tmp_path / "token").write_text(token)
        monkeypatch.setenv("CONSUL_HTTP_TOKEN_FILE", str(tmp_path / "token"))
    return Drainer(server=lambda: Driver(min_np), discovery=variables.from_environment)


def test_the_request_names_every_instance_on_the_host_once_per_world(consul_kind, monkeypatch, tmp_path):
    with consul_cluster(consul_kind, ["localhost", "127.0.0.1"]) as cluster:
        register(cluster.addr("localhost"), slots="2")
        register(cluster.addr("127.0.0.1"), slots="1")
        register(cluster.addr("127.0.0.1"), "horovod-b", slots="1")
        drainer = ask(cluster, monkeypatch, tmp_path)
        outcome = drainer.drain(slow(), 0.1, 3, 2, POLICY)
        assert outcome.status == REQUESTED, outcome
        assert outcome.instances == ("127.0.0.1/horovod", "127.0.0.1/horovod-b")
        for sid in ("horovod", "horovod-b"):
            code, entries = consul_request(cluster.addr("localhost"), "GET", "/v1/kv/" + stragglers.request_key(
                "horovod", "127.0.0.1", sid) + "?raw")
            assert code == 200 and stragglers.Request(**entries) == stragglers.Request(
                "127.0.0.1", 3.0, 0.3, 0.1, 3, 20), entries
        again = drainer.drain(slow(), 0.1, 3, 2, POLICY)  # the host has not left yet: no second request
        assert again.status == SKIPPED and "127.0.0.1 asked for earlier is still under way" in again.why
        drainer.new_world()
        assert drainer.drain(slow("nowhere"), 0.1, 3, 2, POLICY).status == FAILED  # no instance on that host
        assert drainer.drain(slow(), 0.1, 3, 2, POLICY).status == REQUESTED


def test_below_min_np_nothing_is_written(consul_kind, monkeypatch, tmp_path):
    with consul_cluster(consul_kind, ["localhost", "127.0.0.1"]) as cluster:
        register(cluster.addr("127.0.0.1"), slots="1")
        outcome = ask(cluster, monkeypatch, tmp_path, min_np=3).drain(slow(), 0.1, 3, 2, POLICY)
        assert outcome.status == SKIPPED and "below --min-np 3" in outcome.why
        key = stragglers.request_key("horovod", "127.0.0.1", "horovod")
        assert consul_request(cluster.addr("localhost"), "GET", f"/v1/kv/{key}")[0] == 404


def test_a_refusal_by_acls_is_final_for_the_run(consul_kind, monkeypatch, tmp_path):
    with consul_cluster(consul_kind, ["localhost", "127.0.0.1"], acl_token=ADMIN, restricted_token=WRITER_OF_NOTHING,
                        restricted_node_prefixes=[""], restricted_service_prefixes=["horovod"]) as cluster:
        register(cluster.addr("127.0.0.1"), slots="1", token=ADMIN)
        drainer = ask(cluster, monkeypatch, tmp_path, token=WRITER_OF_NOTHING)
        outcome = drainer.drain(slow(), 0.1, 3, 2, POLICY)
        assert outcome.status == REFUSED and "refused access (403" in outcome.why, outcome
        assert drainer.pending is None
        drainer.new_world()
        later = drainer.drain(slow(), 0.1, 3, 2, POLICY)
        assert later.status == SKIPPED and later.why.startswith("Consul refused an earlier request")
