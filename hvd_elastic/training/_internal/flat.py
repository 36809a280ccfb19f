"""Flat host buffers for committed tensors, and their buckets.

A :class:`FlatLayout` describes an ordered list of tensors (key, dtype, shape)
as ranges of a few preallocated host buffers, one per dtype
(:class:`FlatBuffer`); every tensor is a view into its dtype's buffer.
Committing is then one ``copy_`` per tensor into memory that already exists
(no allocation, no ``deepcopy``, no second device copy), and a sync after a
reset moves ranges of it in a handful of large collectives instead of one per
tensor (:mod:`.transfer`).

One buffer per dtype (rather than one byte buffer for all) keeps every view
an ordinary tensor of its storage's own type, so a snapshot of views
serializes with ``torch.save`` as one storage per dtype.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

import torch

#: Default bucket size of a sync: large enough that per-collective overhead
#: vanishes, small enough that copying one bucket overlaps sending the next.
DEFAULT_BUCKET_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Where one tensor lives: ``numel`` elements from ``offset`` of its dtype's buffer."""

    key: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    numel: int


class FlatLayout:
    """An ordered layout of (key, dtype, shape) over one buffer per dtype.

    Two layouts are equal when they hold the same keys, dtypes and shapes in
    the same order; that is the test for "can the existing buffers be reused".
    """

    def __init__(self, entries: Iterable[tuple[str, torch.dtype, Sequence[int]]]):
        specs = []
        sizes: dict[torch.dtype, int] = {}
        for key, dtype, shape in entries:
            shape = tuple(int(s) for s in shape)
            numel = 1
            for s in shape:
                numel *= s
            offset = sizes.get(dtype, 0)
            specs.append(TensorSpec(key, dtype, shape, offset, numel))
            sizes[dtype] = offset + numel
        self.specs: tuple[TensorSpec, ...] = tuple(specs)
        #: elements per dtype, in order of first appearance
        self.sizes = sizes
        self.nbytes = sum(n * _itemsize(dtype) for dtype, n in sizes.items())
        self._signature = tuple((s.key, s.dtype, s.shape) for s in specs)

    @classmethod
    def of(cls, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> "FlatLayout":
        return cls((k, t.dtype, t.shape) for k, t in named_tensors)

    def describe(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """A picklable description (dtype as a string) from which :meth:`parse` rebuilds it."""
        return [(key, str(dtype).replace("torch.", ""), shape) for key, dtype, shape in self._signature]

    @classmethod
    def parse(cls, described: Sequence[tuple[str, str, Sequence[int]]]) -> "FlatLayout":
        entries = []
        for key, dtype_name, shape in described:
            dtype = getattr(torch, dtype_name, None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"unknown tensor dtype {dtype_name!r} for {key!r} in a state layout")
            entries.append((key, dtype, shape))
        return cls(entries)

    def matches(self, named_tensors: Sequence[tuple[str, torch.Tensor]]) -> bool:
        if len(named_tensors) != len(self._signature):
            return False
        for (key, tensor), (k, dtype, shape) in zip(named_tensors, self._signature):
            if key != k or tensor.dtype != dtype or tuple(tensor.shape) != shape:
                return False
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FlatLayout) and self._signature == other._signature

    def __hash__(self) -> int:
        return hash(self._signature)

    def __len__(self) -> int:
        return len(self.specs)


class FlatBuffer:
    """Preallocated host memory for one :class:`FlatLayout`.

    ``views[i]`` is the tensor for ``layout.specs[i]``, a view of
    ``storage[dtype]``.  The memory is pinned when CUDA is available
    (device-to-host copies then run at full bandwidth and asynchronously).
    """

    def __init__(self, layout: FlatLayout, *, pin_memory: bool | None = None):
        if pin_memory is None:
            pin_memory = torch.cuda.is_available()
        self.layout = layout
        self.storage = {
            dtype: torch.empty(numel, dtype=dtype, pin_memory=pin_memory) for dtype, numel in layout.sizes.items()
        }
        self.views: list[torch.Tensor] = [
            self.storage[s.dtype][s.offset : s.offset + s.numel].view(s.shape) for s in layout.specs
        ]

    def as_dict(self) -> dict[str, torch.Tensor]:
        return {spec.key: view for spec, view in zip(self.layout.specs, self.views)}

    def copy_from(self, tensors: Sequence[torch.Tensor]) -> None:
        """Copy live tensors (in layout order) into the buffer."""
        copy_tensors(self.views, tensors)

    def copy_indices(self, indices: Sequence[int], tensors: Sequence[torch.Tensor]) -> None:
        """Copy ``tensors[i]`` into ``views[i]`` for ``i`` in ``indices`` (one bucket's worth)."""
        copy_tensors([self.views[i] for i in indices], [tensors[i] for i in indices])

    def buckets(self, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list["Bucket"]:
        """Split each dtype's buffer at tensor boundaries into buckets of about ``bucket_bytes``.

        A tensor never spans two buckets (so one bucket can be filled or
        unpacked while another is on the wire); a tensor larger than
        ``bucket_bytes`` gets a bucket of its own.
        """
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        buckets: list[Bucket] = []
        for dtype, storage in self.storage.items():
            itemsize = storage.element_size()
            members = [i for i, s in enumerate(self.layout.specs) if s.dtype == dtype]
            current: list[int] = []
            for i in members:
                spec = self.layout.specs[i]
                if current:
                    first = self.layout.specs[current[0]]
                    if (spec.offset + spec.numel - first.offset) * itemsize > bucket_bytes:
                        buckets.append(Bucket(current, self.span(current)))
                        current = []
                current.append(i)
            if current:
                buckets.append(Bucket(current, self.span(current)))
        return buckets

    def span(self, indices: Sequence[int]) -> torch.Tensor:
        """The contiguous range of one dtype's buffer from tensor ``indices[0]`` to ``indices[-1]``."""
        first, last = self.layout.specs[indices[0]], self.layout.specs[indices[-1]]
        return self.storage[first.dtype][first.offset: last.offset + last.numel]


@dataclasses.dataclass
class Bucket:
    """A contiguous range of one dtype's buffer and the tensor indices inside it."""

    indices: list[int]
    data: torch.Tensor


def as_bytes(data: torch.Tensor) -> torch.Tensor:
    """A contiguous range of a buffer as uint8: what collectives move, whatever its dtype
    (Horovod refuses some, bool among them; bytes also travel exactly)."""
    return data.view(torch.uint8)


def copy_tensors(destinations: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]) -> None:
    """``dst.copy_(src)`` for every pair, batched, and finished before returning.

    Same-device pairs go through one batched foreach copy (one dispatch for the
    lot: :func:`hvd_elastic.training._internal.compat.foreach_copy`); device-to-host
    copies are issued non-blocking into pinned memory and waited for once at
    the end.
    """
    if not destinations:
        return
    same, cross_dst, cross_src = [], [], []
    for dst, src in zip(destinations, sources):
        if src.device == dst.device:
            same.append((dst, src))
        else:
            cross_dst.append(dst)
            cross_src.append(src)
    with torch.no_grad():
        if same:
            dsts, srcs = zip(*same)
            _foreach_copy(list(dsts), list(srcs))
        for dst, src in zip(cross_dst, cross_src):
            dst.copy_(src, non_blocking=dst.is_pinned() or dst.device.type != "cpu")
        if cross_dst and torch.cuda.is_available():
            torch.cuda.synchronize()


def _foreach_copy(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
    from hvd_elastic.training._internal import compat  # imported on use: building layouts needs no Horovod

    if compat.foreach_copy(dsts, srcs):
        return
    for dst, src in zip(dsts, srcs):  # the fused kernel refused (mixed strides/dtypes)
        dst.copy_(src)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
