"""horovodrun's rendezvous server with hvd-elastic's driver rules, for tests: Horovod's own server and handler
behind a stand-in driver, and the worker's client of it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace

from horovod.runner import gloo_run
from horovod.runner.common.util.hosts import SlotInfo
from horovod.runner.http.http_server import RendezvousServer

from hvd_elastic.horovodrun import rules
from hvd_elastic.training._internal.rendezvous import Server


@contextlib.contextmanager
def driver_with_rules() -> Iterator[SimpleNamespace]:
    """A stand-in driver whose ``client`` reaches the started server; ``start_world(*hosts)`` starts a world
    of one slot per host, as the driver does."""
    rules.install(gloo_run)
    server = RendezvousServer()
    # finished: rule 7's check, 5 s after a doom, finds the job over and ends nothing.
    driver = SimpleNamespace(_hvd_elastic=rules.Job(), _rank_assignments={}, _rendezvous=server,
                             finished=lambda: True, _min_num_proc=2)
    port = server.start(gloo_run.create_rendezvous_handler(driver))
    driver.client = Server("127.0.0.1", port)
    driver.start_world = lambda *hosts: _start_world(driver, server, hosts)
    try:
        yield driver
    finally:
        server.stop()


def _start_world(driver: SimpleNamespace, server: RendezvousServer, hosts: tuple[str, ...]) -> None:
    plan = [SlotInfo(host, rank, 0, rank, len(hosts), 1, len(hosts)) for rank, host in enumerate(hosts)]
    server.init(plan)  # the store, and a doom with it, are cleared
    driver._rank_assignments = {slot.rank: slot for slot in plan}
