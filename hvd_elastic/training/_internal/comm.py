"""The collectives the state library needs, from whichever library runs the job's world.

The state's sync (:mod:`.sync`, :mod:`.transfer`), its small objects (:mod:`.objects`) and the
shared-directory check speak to one :class:`Comm`: Horovod's once ``hvd.init()`` has run
(``horovodrun``), else ``torch.distributed``'s default process group (``torchrun``), else none (one
process alone, as the unit tests run).  :func:`current` picks at each call, so a module written against it
runs under either launcher and imports neither library until a collective is asked for.

Contract:

* :meth:`Comm.allgather_bytes`: every rank's uint8 tensor, any length each, concatenated in rank order.
  Horovod: one ``allgather``; torch: the lengths first, then the padded bytes (two collectives).
* :meth:`Comm.allgather_rows`: every rank's tensor of one shape, stacked on a new first dimension.
* :meth:`Comm.broadcast_`: ``root``'s tensor into every rank's, in place; asynchronous (a :class:`Handle`).
* :meth:`Comm.alltoall`: ``payload`` cut by ``send_splits`` (elements to each rank, in rank order) and what
  every rank sends this one, concatenated in rank order; each rank names the sizes it receives
  (``recv_splits``): torch needs them, Horovod finds them itself.
* Every method but ``rank`` and ``size`` is collective: each rank of the world calls it with the same
  ``name`` in the same order.  Failures are the library's own (``HorovodInternalError``, torch's
  ``DistBackendError``).
"""

from __future__ import annotations

from typing import Protocol, Sequence

import torch


class Handle(Protocol):
    def done(self) -> bool:
        """Whether the collective has completed (never blocks)."""

    def wait(self) -> torch.Tensor:
        """Block until it completes; the tensor it produced."""


class Comm(Protocol):
    name: str

    def rank(self) -> int: ...

    def size(self) -> int: ...

    def allgather_bytes(self, data: torch.Tensor, *, name: str) -> torch.Tensor: ...

    def allgather_rows(self, row: torch.Tensor, *, name: str) -> torch.Tensor: ...

    def broadcast_(self, tensor: torch.Tensor, root: int, *, name: str) -> Handle: ...

    def alltoall(self, payload: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int], *,
                 name: str) -> Handle: ...


class _HorovodHandle:
    def __init__(self, handle: object, pick=lambda result: result):
        self._handle, self._pick = handle, pick

    def done(self) -> bool:
        import horovod.torch as hvd

        return bool(hvd.poll(self._handle))

    def wait(self) -> torch.Tensor:
        import horovod.torch as hvd

        return self._pick(hvd.synchronize(self._handle))


class HorovodComm:
    name = "horovod"

    def rank(self) -> int:
        import horovod.torch as hvd

        return hvd.rank()

    def size(self) -> int:
        import horovod.torch as hvd

        return hvd.size()

    def allgather_bytes(self, data: torch.Tensor, *, name: str) -> torch.Tensor:
        import horovod.torch as hvd

        return hvd.allgather(data, name=name)

    def allgather_rows(self, row: torch.Tensor, *, name: str) -> torch.Tensor:
        import horovod.torch as hvd

        return hvd.allgather(row.unsqueeze(0), name=name)

    def broadcast_(self, tensor: torch.Tensor, root: int, *, name: str) -> Handle:
        import horovod.torch as hvd

        return _HorovodHandle(hvd.broadcast_async_(tensor, root, name=name))

    def alltoall(self, payload: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int], *,
                 name: str) -> Handle:
        import horovod.torch as hvd

        # Horovod exchanges the splits itself; its result is (received, received splits).
        return _HorovodHandle(hvd.alltoall_async(payload, splits=list(send_splits), name=name),
                              lambda result: result[0])


class _TorchHandle:
    def __init__(self, work, result: torch.Tensor):
        self._work, self._result = work, result

    def done(self) -> bool:
        return bool(self._work.is_completed())

    def wait(self) -> torch.Tensor:
        self._work.wait()
        return self._result


class TorchComm:
    name = "torch.distributed"

    def rank(self) -> int:
        import torch.distributed as dist

        return dist.get_rank()

    def size(self) -> int:
        import torch.distributed as dist

        return dist.get_world_size()

    def allgather_bytes(self, data: torch.Tensor, *, name: str) -> torch.Tensor:
        import torch.distributed as dist

        lengths = self.allgather_rows(torch.tensor([data.numel()], dtype=torch.int64), name=name).flatten().tolist()
        padded = torch.zeros(max(lengths), dtype=torch.uint8)
        padded[: data.numel()] = data
        rows = [torch.empty_like(padded) for _ in lengths]
        dist.all_gather(rows, padded)
        return torch.cat([row[:length] for row, length in zip(rows, lengths)])

    def allgather_rows(self, row: torch.Tensor, *, name: str) -> torch.Tensor:
        import torch.distributed as dist

        rows = [torch.empty_like(row) for _ in range(self.size())]
        dist.all_gather(rows, row.contiguous())
        return torch.stack(rows)

    def broadcast_(self, tensor: torch.Tensor, root: int, *, name: str) -> Handle:
        import torch.distributed as dist

        return _TorchHandle(dist.broadcast(tensor, src=root, async_op=True), tensor)

    def alltoall(self, payload: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int], *,
                 name: str) -> Handle:
        import torch.distributed as dist

        received = torch.empty(sum(recv_splits), dtype=payload.dtype)
        work = dist.all_to_all_single(received, payload.contiguous(), list(recv_splits), list(send_splits),
                                      async_op=True)
        return _TorchHandle(work, received)


HOROVOD, TORCH = HorovodComm(), TorchComm()


def current() -> Comm | None:
    """Horovod's collectives once ``hvd.init()`` ran, else torch.distributed's once its default process group
    exists, else None (one process, no world)."""
    try:
        import horovod.torch as hvd

        if hvd.is_initialized():
            return HOROVOD
    except (ImportError, ValueError, OSError):  # a torchrun job may have no Horovod, or one built for another torch
        pass
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return TORCH
    return None


def required() -> Comm:
    """:func:`current`, for a collective: raises RuntimeError when there is no world."""
    comm = current()
    if comm is None:
        raise RuntimeError("a collective needs a world: hvd.init() or torch.distributed.init_process_group()")
    return comm


def world() -> tuple[int, int]:
    """This process's rank and the world's size: (0, 1) with no world."""
    comm = current()
    return (0, 1) if comm is None else (comm.rank(), comm.size())
