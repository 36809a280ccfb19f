"""hvd_elastic.torchrun.handler in one process: three nodes' rendezvous handlers against one Consul cluster (the
dev agent and HashiCorp Consul), each with its node agent's instance registered on its own agent.  A drained
node leaves its round at once, the others see a member gone, the drained one waits out of the job until it
is undrained and then asks to join; a round's rank 0 publishes a fresh agent store every round."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from torch.distributed.elastic.rendezvous import RendezvousInfo

from hvd_elastic.consul import api
from hvd_elastic.consul.config import ConsulConfig
from hvd_elastic.local.realconsul import consul_cluster
from hvd_elastic.torchrun.handler import ConsulRendezvousHandler, create
from testbed import wait_until
from testbed.consul import consul_request, register
from tests.torchrun.rdzv_params import parameters

pytestmark = pytest.mark.slow

NODES = ["n1", "n2", "n3"]
CONF = {"last_call_timeout": "2", "keep_alive_interval": "1", "keep_alive_max_attempt": "10", "leave_grace": "2"}
WAIT = 60.0  # hang guards, not speed bounds


class Node:
    def __init__(self, cluster, name: str, run_id: str, addr: str):
        self.cluster, self.name = cluster, name
        self.handler: ConsulRendezvousHandler = create(parameters(cluster.addr(name), run_id, 2, local_addr=addr,
                                                                  **CONF))
        self.info: RendezvousInfo | None = None
        self.thread: threading.Thread | None = None

    def join(self) -> "Node":
        def run() -> None:
            self.info = self.handler.next_rendezvous()

        self.info = None
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        return self

    def joined(self, timeout: float = WAIT) -> RendezvousInfo:
        self.thread.join(timeout)
        assert self.info is not None, f"{self.name} did not join within {timeout} s"
        return self.info

    def maintenance(self, enable: bool) -> None:
        status, _ = consul_request(self.cluster.addr(self.name), "PUT",
                                   f"/v1/agent/service/maintenance/horovod?enable={str(enable).lower()}&reason=test")
        assert status == 200


def store_rounds(cluster, run_id: str) -> list[int]:
    """The rounds with keys in the run's agent store."""
    prefix = f"hvd-elastic/torchrun/{run_id}/store/"
    folders = api.kv_keys(ConsulConfig.from_env({}, addr=cluster.addr(NODES[0])), prefix, "/")
    return sorted(int(folder.removeprefix(prefix + "round-").rstrip("/")) for folder in folders
                  if folder.startswith(prefix + "round-"))


def together(nodes: list[Node]) -> list[RendezvousInfo]:
    for node in nodes:
        node.join()
    return [node.joined() for node in nodes]


def test_a_drained_node_leaves_at_once_and_rejoins_when_undrained(consul_kind):
    run_id = f"job-{uuid.uuid4().hex[:8]}"
    with consul_cluster(consul_kind, NODES) as cluster:
        for name in NODES:
            register(cluster.addr(name))
        nodes = [Node(cluster, name, run_id, f"127.0.0.{i}") for i, name in enumerate(NODES, 1)]
        first = together(nodes)
        assert sorted(info.rank for info in first) == [0, 1, 2] and {info.world_size for info in first} == {3}
        one, two, three = nodes
        assert one.handler.num_nodes_waiting() == 0

        three.maintenance(True)  # its agent polls, as torchrun's does between its workers' checks
        wait_until("the drained node to leave its round", lambda: three.handler.num_nodes_waiting() == 0
                   and three.handler._left_at is not None, WAIT)
        wait_until("the others to see a member gone", lambda: two.handler.num_nodes_waiting() >= 1
                   and one.handler.num_nodes_waiting() >= 1, 5)  # their reads of the state are a second old at most
        wait_until("the drained node's own restart after the grace", lambda: three.handler.num_nodes_waiting() >= 1,
                   WAIT)

        three.join()  # out of the job: it waits
        second = together([one, two])
        rounds_then = store_rounds(cluster, run_id)
        assert {info.world_size for info in second} == {2} and sorted(i.rank for i in second) == [0, 1]
        time.sleep(2.5)
        assert three.info is None and three.thread.is_alive()

        three.maintenance(False)
        wait_until("the undrained node to ask to join", lambda: one.handler.num_nodes_waiting() >= 1, WAIT)
        third = together([one, two]) + [three.joined()]
        assert {info.world_size for info in third} == {3}
        stores = {(i.bootstrap_store_info.master_addr, i.bootstrap_store_info.master_port) for i in third}
        assert len(stores) == 1 and stores != {(first[0].bootstrap_store_info.master_addr,
                                                first[0].bootstrap_store_info.master_port)}
        # Each round's rank 0 deleted the store keys of the rounds before the last one.
        last = one.handler._state_holder.state.round
        assert min(rounds_then) < last - 1 and min(store_rounds(cluster, run_id)) >= last - 1, rounds_then
        for node in nodes:
            node.handler.shutdown()
