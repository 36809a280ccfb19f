"""hvd_elastic.torchrun.store on the dev agent and HashiCorp Consul: the store torch's agents bootstrap from,
used as torch uses it (through ``PrefixStore``, its barrier, its ``add``)."""

from __future__ import annotations

import datetime
import threading
import time

import pytest
import torch.distributed as dist
from torch.distributed.elastic.utils import store as store_util

from hvd_elastic.consul import api
from hvd_elastic.torchrun.settings import RendezvousSettings
from hvd_elastic.torchrun.store import ConsulStore
from testbed.consul import consul_request
from tests.torchrun.rdzv_params import parameters


def store(consul, run_id: str | None = None, timeout: float = 20.0) -> ConsulStore:
    settings = RendezvousSettings.from_parameters(parameters(consul.addr("localhost"), run_id))
    return ConsulStore(settings, datetime.timedelta(seconds=timeout))


def test_set_get_check_and_prefixes(consul):
    mine = store(consul)
    mine.set("MASTER_ADDR", "10.0.0.1")
    mine.set(b"bin\x00ary/key", b"\x00\xff")
    assert mine.get("MASTER_ADDR") == b"10.0.0.1" and mine.get(b"bin\x00ary/key") == b"\x00\xff"
    assert mine.check(["MASTER_ADDR"]) and not mine.check(["MASTER_ADDR", "absent"])
    prefixed = dist.PrefixStore("torch.rendezvous.j.0", mine)
    prefixed.multi_set(["a", "b"], ["1", "2"])
    assert prefixed.multi_get(["a", "b"]) == [b"1", b"2"]
    assert not store(consul).check(["MASTER_ADDR"])  # another run's store


def test_get_blocks_until_the_key_is_set(consul):
    mine = store(consul)
    later = threading.Timer(1.5, lambda: store(consul, mine.settings.run_id).set("k", "v"))
    begun = time.monotonic()
    later.start()
    try:
        assert mine.get("k") == b"v"
    finally:
        later.cancel()
    assert 1.0 < time.monotonic() - begun < 15  # woken by the write, not by a poll of the whole timeout


def test_get_and_wait_end_at_the_timeout_naming_the_key(consul):
    mine = store(consul, timeout=1.0)
    with pytest.raises(dist.DistStoreError, match="key 'never' did not appear"):
        mine.get("never")
    with pytest.raises(dist.DistStoreError, match="key 'never' did not appear"):
        mine.wait(["never"], datetime.timedelta(seconds=0.5))


def test_add_is_atomic_across_agents(consul):
    run_id = store(consul).settings.run_id
    results: list[int] = []

    def count() -> None:
        mine = store(consul, run_id)
        results.extend(mine.add("n", 1) for _ in range(10))

    threads = [threading.Thread(target=count) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(results) == list(range(1, 41))
    assert store(consul, run_id).add("n", 0) == 40


def test_torchs_barrier_passes_on_it(consul):
    run_id = store(consul).settings.run_id
    errors: list[BaseException] = []

    def agent(rank: int) -> None:
        try:
            store_util.barrier(store(consul, run_id), 3, key_prefix="exit", barrier_timeout=60, rank=rank)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=agent, args=(rank,)) for rank in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert not errors and not any(t.is_alive() for t in threads)


def test_a_value_that_is_not_ours_is_a_store_error(consul):
    mine = store(consul)
    status, _ = consul_request(consul.addr("localhost"), "PUT", f"/v1/kv/{mine._key('k')}", {"other": 1})
    assert status == 200
    with pytest.raises(dist.DistStoreError, match="holds no store value"):
        mine.get("k")


def test_a_rounds_keys_lie_in_its_folder_and_finished_rounds_are_dropped_whole(consul):
    mine = store(consul)
    for round_ in (3, 4, 5):
        dist.PrefixStore(f"torch.rendezvous.{mine.settings.run_id}.{round_}", mine).set("MASTER_ADDR", f"r{round_}")
    mine.set("not.a.round/key", "kept")
    folders = api.kv_keys(mine.settings.consul, mine.prefix, "/")
    assert sorted(folder.removeprefix(mine.prefix) for folder in folders if folder.endswith("/")) == [
        "round-3/", "round-4/", "round-5/"]
    assert mine.drop_rounds_before(5) == 2 and mine.drop_rounds_before(5) == 0
    assert dist.PrefixStore(f"torch.rendezvous.{mine.settings.run_id}.5", mine).get("MASTER_ADDR") == b"r5"
    assert mine.get("not.a.round/key") == b"kept"
    assert not dist.PrefixStore(f"torch.rendezvous.{mine.settings.run_id}.4", mine).check(["MASTER_ADDR"])
