"""The rendezvous parameters torchrun would hand the Consul backend, for the tests here."""

from __future__ import annotations

import uuid

from torch.distributed.elastic.rendezvous import RendezvousParameters


def parameters(endpoint: str, run_id: str | None = None, min_nodes: int = 1, **conf) -> RendezvousParameters:
    return RendezvousParameters("consul", endpoint, run_id or f"t{uuid.uuid4().hex[:12]}", min_nodes, 3, **conf)
