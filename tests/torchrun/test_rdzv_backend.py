"""hvd_elastic.torchrun.backend on the dev agent and HashiCorp Consul: torch's backend contract (the cases of
torch's own ``RendezvousBackendTestMixin``), races, refusals, and states that are not ours."""

from __future__ import annotations

import base64
import os
import pickle
import threading
import uuid

import pytest
from torch.distributed.elastic.rendezvous import RendezvousConnectionError, RendezvousStateError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState

from hvd_elastic.local import ports
from hvd_elastic.local.realconsul import consul_cluster
from hvd_elastic.torchrun.backend import ConsulRendezvousBackend
from hvd_elastic.torchrun.settings import RendezvousSettings
from testbed.consul import consul_request
from tests.torchrun.rdzv_params import parameters


def backend(addr: str, run_id: str | None = None, **conf) -> ConsulRendezvousBackend:
    return ConsulRendezvousBackend(RendezvousSettings.from_parameters(parameters(addr, run_id, **conf)))


def state(round_: int) -> bytes:
    value = _RendezvousState()
    value.round = round_
    return pickle.dumps(value)


def round_of(bits: bytes) -> int:
    return pickle.loads(bits).round


def test_the_backend_contract(consul):
    one = backend(consul.addr("localhost"))
    assert one.name == "consul" and one.get_state() is None
    bits, token, won = one.set_state(state(1))  # no token: create only
    assert won and round_of(bits) == 1 and isinstance(token, int)
    assert one.get_state() == (bits, token)
    again, same, won = one.set_state(state(2))  # create only, and it exists: theirs comes back
    assert not won and round_of(again) == 1 and same == token
    newer, token2, won = one.set_state(state(3), token)
    assert won and round_of(newer) == 3 and token2 > token
    stale, token3, won = one.set_state(state(4), token)  # a stale token changes nothing
    assert not won and round_of(stale) == 3 and token3 == token2
    odd, token4, won = one.set_state(state(5), "not-a-token")
    assert not won and round_of(odd) == 3 and token4 == token2


def test_runs_never_see_each_others_state(consul):
    a, b = backend(consul.addr("localhost")), backend(consul.addr("localhost"))
    a.set_state(state(7))
    assert b.get_state() is None


def test_racing_writers_lose_no_update(consul):
    run_id = f"race-{uuid.uuid4().hex[:8]}"
    backend(consul.addr("localhost"), run_id).set_state(state(0))

    def bump(times: int) -> None:
        mine = backend(consul.addr("localhost"), run_id)
        bits, token = mine.get_state()
        for _ in range(times):
            while True:  # torch's loop: on a lost race, decide again from the winner's state
                bits, token, won = mine.set_state(state(round_of(bits) + 1), token)
                if won:
                    break

    threads = [threading.Thread(target=bump, args=(15,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert round_of(backend(consul.addr("localhost"), run_id).get_state()[0]) == 60


def put_raw(consul, key: str, value: dict) -> None:
    status, _ = consul_request(consul.addr("localhost"), "PUT", f"/v1/kv/{key}", value)
    assert status == 200


@pytest.mark.parametrize("value,words", [
    ({"format": 2, "state": ""}, "expected a JSON object with format 1"),
    ({"format": 1, "state": "%%%"}, "holds no rendezvous state"),
    ({"format": 1, "state": base64.b64encode(b"not a pickle").decode()}, "holds no rendezvous state"),
    ({"format": 1, "state": base64.b64encode(pickle.dumps(os.system)).decode()},
     "it names posix.system, which is no part of a rendezvous state"),
])
def test_a_value_that_is_no_state_is_refused_before_torch_unpickles_it(consul, value, words):
    mine = backend(consul.addr("localhost"))
    put_raw(consul, mine.key, value)
    with pytest.raises(RendezvousStateError) as caught:
        mine.get_state()
    assert words in str(caught.value) and mine.key in str(caught.value)


def test_a_state_over_consuls_value_limit_is_refused_before_the_write(consul):
    mine = backend(consul.addr("localhost"))
    with pytest.raises(RendezvousStateError, match="over Consul's 512 KiB value limit"):
        mine.set_state(b"x" * (400 * 1024))
    assert mine.get_state() is None


def test_an_unreachable_consul_is_a_connection_error_after_read_timeout():
    port, = ports.reserve(1)
    mine = backend(f"127.0.0.1:{port}", read_timeout="1")
    with pytest.raises(RendezvousConnectionError) as caught:
        mine.get_state()
    assert mine.key in str(caught.value) and "cannot reach" in str(caught.value)


def test_a_token_without_key_rights_is_refused_at_once(consul_kind, monkeypatch, tmp_path):
    admin, reader = f"admin-{uuid.uuid4().hex}", str(uuid.uuid4())
    with consul_cluster(consul_kind, ["localhost"], acl_token=admin, restricted_token=reader,
                        restricted_node_prefixes=[""], restricted_service_prefixes=["horovod"]) as cluster:
        (tmp_path / "token").write_text(reader)
        monkeypatch.setenv("CONSUL_HTTP_TOKEN_FILE", str(tmp_path / "token"))
        mine = backend(cluster.addr("localhost"))
        with pytest.raises(RendezvousConnectionError) as caught:
            mine.set_state(state(1))
        assert "403" in str(caught.value) and mine.key in str(caught.value)
