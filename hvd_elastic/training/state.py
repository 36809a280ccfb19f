"""TrainingState: everything a PyTorch training job needs to survive resizes.

A drop-in :class:`horovod.common.elastic.State` (``hvd.elastic.State``) for
``hvd.elastic.run`` and :func:`hvd_elastic.run`.  Compared with Horovod's
``TorchState`` it

* commits model, optimizer, LR schedulers, AMP ``GradScaler``, RNG states,
  the sampler position, user values and any registered object;
* commits by copying tensors into ONE preallocated host buffer (pinned when
  CUDA exists): no ``deepcopy``, no second device copy; the buffer is
  reallocated only when the layout changes (Adam's moments appear after the
  first step);
* syncs with one object broadcast for everything small and, for the
  tensors, moves only what ranks lack: digests of the buffer show which
  ranks already hold rank 0's committed tensors (survivors usually do), and
  those send the rest in disjoint stripes to the ranks that need it
  (:mod:`~hvd_elastic.training._internal.transfer`); a new rank's optimizer state is
  created directly from the bytes (no dummy ``optimizer.step()``, so no
  parameter moves);
* re-partitions the sampler and applies the :class:`BatchPolicy` after EVERY
  reset, including removal-only resets where Horovod skips ``sync``.

Usage::

    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), op=hvd.Sum)
    sampler = ExactlyOnceSampler(dataset, batch_size=32, seed=0)
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=4,
                        collate_fn=ExactlyOnceSampler.collate())
    state = TrainingState(model=model, optimizer=optimizer, schedulers=[sched],
                          scaler=scaler, sampler=sampler, epoch=0, step=0)

    @hvd_elastic.run(checkpoint_dir="/shared/run1/ckpt")
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            sampler.set_epoch(state.epoch)
            for batch in loader:          # a new iterator after every reset
                optimizer.zero_grad()
                if batch is not None:     # None: idle step (see sampler.py)
                    x, y = batch          # every sample weighs 1 / samples_this_step
                    loss = criterion(model(x), y, reduction="sum") / sampler.samples_this_step
                    loss.backward()
                optimizer.step()
                state.commit_step()       # record_batch() + step += 1 + commit()

Semantics follow Horovod's: ``commit() = save() + check_host_updates()``;
``restore()`` returns the live objects to the last commit; ``sync()`` makes
every rank equal to rank 0 (and commits that locally, so a rank that joined
can roll back to it).

What lives where: how each kind of object is committed is in
:mod:`~hvd_elastic.training.components` (a registry of adapters); how batch
size, LR and accumulation follow the world is in
:mod:`~hvd_elastic.training.batching`; the snapshot format is in
:mod:`~hvd_elastic.training._internal.snapshot`; every private Horovod/torch attribute
is in :mod:`~hvd_elastic.training._internal.compat`.

Snapshots
---------
:meth:`snapshot` returns the last committed state as a nested dict of CPU
tensors and plain Python values (``torch.load(weights_only=True)`` reads it
back).  It is cheap: its tensors are VIEWS of the commit buffer, valid until
the next commit overwrites them.  A background writer must either hold
:attr:`snapshot_lock` while it serializes (commits wait meanwhile) or take
``snapshot(copy=True)`` (a private copy, made under the lock).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Iterable, Sequence

import torch
import horovod.torch as hvd
from horovod.common.elastic import State
from horovod.common.exceptions import HorovodInternalError

from hvd_elastic.training import settings as worker_settings
from hvd_elastic.training._internal import comm, compat, forksafe, join_ahead, transfer
from hvd_elastic.training.batching import BatchPolicy, fit_to_world, new_bookkeeping
from hvd_elastic.training.components import Adapter, adapter_for, is_stateful
from hvd_elastic.training._internal.objects import allgather_object, broadcast_object
from hvd_elastic.training._internal.sync import move
from hvd_elastic.training._internal.flat import DEFAULT_BUCKET_BYTES, FlatBuffer, FlatLayout, copy_tensors
from hvd_elastic.training._internal.rng import RNGState
from hvd_elastic.training._internal.snapshot import SNAPSHOT_FORMAT, check_loadable, tree_copy

log = logging.getLogger(__name__)

Listener = Callable[[str, dict], None]

# Instance attributes that user values must not shadow.
_RESERVED = frozenset({"commit_count", "snapshot_lock", "values"})


class TrainingState(State):
    """Committed, restorable, syncable training state.

    Args:
        model: a ``torch.nn.Module``.
        optimizer: a ``torch.optim.Optimizer`` (a Horovod ``DistributedOptimizer`` too).
        schedulers: LR schedulers (anything with ``state_dict``/``load_state_dict``).
        scaler: an AMP ``GradScaler``.
        sampler: an :class:`~hvd_elastic.training.sampler.ExactlyOnceSampler` (or
            any object with ``state_dict``/``load_state_dict``; ``set_world`` is
            called on it after every sync and reset when it has one).
        batch_policy: a :class:`BatchPolicy`; ``None`` keeps batch and LR as they are.
            With a policy the sampler takes its step from it: an
            ``ExactlyOnceSampler`` given a ``batch_size`` too is refused.
        rng: commit/restore/sync torch (CPU and CUDA), NumPy and Python RNG
            states.  Restores are exact; after a sync rank 0 keeps its streams
            and every other rank continues streams of its own, derived from
            rank 0's committed state and its rank (deterministic).
        bucket_bytes: size of the broadcast buckets of :meth:`sync`.
        **values: user values (epoch, step, metrics...), exposed as attributes
            and committed with the rest: tensors, numbers, strings, lists,
            tuples, sets and dicts of them, what ``weights_only=True`` loads.
            Anything else (a lambda, a NumPy array, an arbitrary object) raises
            ``TypeError`` naming it where it is stored: here, at ``state.x =``,
            or at the commit after an in-place change, on every rank alike,
            never as a checkpoint that is silently not written.  A value with ``state_dict``/``load_state_dict`` (a
            second scheduler, an EMA, a custom sampler) is not a value: it is
            registered as a component under its name (see :meth:`register`)
            and stays the same live object across restores.  Every value is
            named here, with its initial value (``best=None``): setting a new
            attribute after construction is refused, since nothing would
            commit it.
    """

    _last_updated_timestamp: float  # Horovod's State sets it; its untyped class cannot tell mypy

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        schedulers: Iterable[Any] = (),
        scaler: Any = None,
        sampler: Any = None,
        batch_policy: BatchPolicy | None = None,
        rng: bool = True,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        **values: Any,
    ):
        self._check_values(values)
        settings = worker_settings.from_environment()  # the job's switches, read once: a bad one fails here
        self._worker_settings = settings
        forksafe.install(settings.fork_safety)  # DataLoader workers forked from now on drop their Gloo sockets
        objects = {name: v for name, v in values.items() if is_stateful(v)}
        object.__setattr__(self, "_values", {name: v for name, v in values.items() if name not in objects})
        super().__init__(bcast_object=broadcast_host_updates, get_rank=hvd.rank)
        self._host_check = join_ahead.HostCheck(broadcast_host_updates, settings.join_ahead)
        self.model = model
        self.optimizer = optimizer
        self.schedulers = list(schedulers)
        self.scaler = scaler
        self.sampler = sampler
        self.batch_policy = batch_policy
        self.bucket_bytes = int(bucket_bytes)
        self.commit_count = 0
        self.snapshot_lock = threading.RLock()
        self._listeners: list[Listener] = []
        self._components: dict[str, Adapter] = {}
        self._buffer: FlatBuffer | None = None
        self._meta: dict[str, Any] = {}
        # Version counters of the live tensors when they last equalled the
        # committed copy (after a commit, restore, load or sync); None until
        # then.  Lets sync() on rank 0 send the committed copy instead of
        # copying live tensors that did not change.
        self._clean_versions: tuple | None = None
        # Where this rank's committed tensors come from: (origin, saves since).  A
        # random origin is drawn whenever they stop descending from a sync (this
        # constructor, load_snapshot, rank 0's own copy at a sync); every rank adopts
        # rank 0's at a sync, and each save counts.  Ranks committing in lockstep keep
        # equal lineages; a rank whose lineage differs from rank 0's surely lacks the
        # state, so a sync sends it everything without hashing (digests decide the rest).
        self._lineage = transfer.new_lineage()
        # Policy bookkeeping is state too: a joining rank must learn from rank 0
        # what LR scale is already applied and what the base world size was.
        self._policy = new_bookkeeping()
        self._register_components(rng, objects)
        self._apply_world()
        self._save()
        self._constructed = True  # from now on a new public attribute is refused (see __setattr__)

    @property
    def worker_settings(self) -> worker_settings.WorkerSettings:
        """The job's switches (:mod:`hvd_elastic.training.settings`), read from the environment at construction."""
        return self._worker_settings

    @classmethod
    def _check_values(cls, values: dict[str, Any]) -> None:
        """Refuse a user value whose name is taken, or that no checkpoint could hold."""
        for name, value in values.items():
            if name.startswith("_") or name in _RESERVED or hasattr(cls, name):
                raise ValueError(f"user value name {name!r} is reserved by TrainingState; choose another name")
            if not is_stateful(value):
                check_loadable(value, f"state.{name}")

    def _register_components(self, rng: bool, objects: dict[str, Any]) -> None:
        """The constructor's components, in their fixed order (the layout of every commit follows it)."""
        named = [("model", self.model), ("optimizer", self.optimizer),
                 *((f"scheduler.{i}", s) for i, s in enumerate(self.schedulers)),
                 ("scaler", self.scaler), ("sampler", self.sampler), ("rng", RNGState() if rng else None)]
        for name, component in named:
            if component is not None:
                self.register(name, component)
        for name, obj in objects.items():
            object.__setattr__(self, name, obj)
            self.register(name, obj)

    # -- registration and listeners ------------------------------------------------------

    def register(self, name: str, obj: Any) -> None:
        """Commit/restore/sync ``obj`` (a Module, an Optimizer, or anything with
        ``state_dict()``/``load_state_dict()``) under ``name`` from now on, with
        the adapter :func:`~hvd_elastic.training.components.adapter_for` picks.

        Registering after construction takes effect at the next commit (a
        restore before it leaves the object as it is).
        """
        if not name or "/" in name:
            raise ValueError(f"component name must be non-empty and contain no '/', got {name!r}")
        if name in self._components:
            raise ValueError(f"a component named {name!r} is already registered")
        self._components[name] = adapter_for(obj)

    def add_listener(self, fn: Listener) -> None:
        """Call ``fn(event, fields)`` on this rank after each "commit", "restore" and "sync", and
        "committed" when a commit's host check passed (no interrupt): the next step starts there.

        An exception ``fn`` raises is logged and training goes on, except Horovod's
        ``HorovodInternalError`` (a collective ``fn`` ran failed), which is raised from the
        commit, restore or sync.

        Fields: commit ``seconds`` (the host copy), ``commit_count``, ``bytes``; committed ``commit_count``;
        restore ``seconds``, ``bytes``; sync ``seconds``, ``bytes`` (this rank's
        ``sent_bytes`` + ``received_bytes`` of tensors), ``transfer`` (``none``, or
        ``broadcast``, ``relay`` and ``stripes`` joined by ``+``: how the units
        travelled), ``receivers`` (ranks that were sent tensors),
        ``plan`` (how the receivers were found: ``lineages``, no other rank
        descends from rank 0's commit, so everyone, without hashing; ``digests``,
        the ranks outside its lineage first, then whatever the digests show
        differs) and ``broadcast_seconds`` (the transfers, with the copies and
        the hashing they overlap).
        """
        self._listeners.append(fn)

    def _emit(self, event: str, **fields: Any) -> None:
        for fn in self._listeners:
            try:
                fn(event, fields)
            except HorovodInternalError:
                # A listener's collective failed (the run decorator's straggler gather): the world is broken,
                # and the elastic loop must hear it as it hears the state's own collectives.
                raise
            except Exception:  # a broken listener must never break training
                log.exception("state listener %r failed on %s", fn, event)

    # -- user values as attributes --------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values")
        if values is not None and name in values:
            return values[name]
        raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        """Set a user value, or an attribute that exists; refuse a new public attribute after construction.

        A new attribute (``state.best = x``) would never be committed, restored
        or checkpointed, so it is refused with ``AttributeError``.  Private
        names stay free: Horovod's ``State`` keeps its bookkeeping in ``_``
        attributes it sets outside ``__init__``.  A subclass declares an
        extra public attribute on the class.
        """
        values = self.__dict__.get("_values")
        if values is not None and name in values:
            check_loadable(value, f"state.{name}")  # here, not at a checkpoint write long after
            values[name] = value
        elif (name.startswith("_") or name in self.__dict__ or hasattr(type(self), name)
              or not self.__dict__.get("_constructed", False)):
            object.__setattr__(self, name, value)
        else:
            known = ", ".join(sorted(values or ())) or "none"  # values is None only before __init__ sets it
            raise AttributeError(
                f"cannot set {name!r} on TrainingState: it is not one of its values ({known}), so it would never "
                f"be committed, restored or checkpointed; pass it at construction: TrainingState(..., {name}=...)"
            )

    @property
    def values(self) -> dict[str, Any]:
        """The live user values (a copy)."""
        return dict(self._values)

    # -- Horovod State interface -----------------------------------------------------------

    def commit_step(self) -> None:
        """End one training step: ``sampler.record_batch()``, ``step += 1`` (when there is
        a ``step`` value), then :meth:`commit`.  The one call a per-step loop needs."""
        if self.sampler is not None:
            self.sampler.record_batch()
        if "step" in self._values:
            self._values["step"] += 1
        self.commit()

    def commit(self) -> None:
        """Save everything to host memory, then raise ``HostsUpdatedInterrupt`` if hosts changed."""
        for component in self._components.values():
            component.before_commit()
        seconds, nbytes = self._save(clean=True)
        self.commit_count += 1
        self._emit("commit", seconds=seconds, commit_count=self.commit_count, bytes=nbytes)
        self._agree_on_hosts()
        # The host check is a collective where the ranks wait for the slowest: the straggler clock of the run
        # decorator (training/_internal/pace.py) starts a step's own work here, not at "commit".
        self._emit("committed", commit_count=self.commit_count)

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` if hosts changed (collective, like Horovod's)."""
        # Called on its own, between commits: the live state may have moved on
        # in ways version counters miss, so the next sync copies it afresh.
        self._clean_versions = None
        self._agree_on_hosts()

    def _agree_on_hosts(self) -> None:
        # Horovod's check, except that added hosts may be joined ahead: see join_ahead.
        self._last_updated_timestamp, interrupt = self._host_check.check(self._last_updated_timestamp,
                                                                         self._host_messages)
        if interrupt is not None:
            raise interrupt

    def save(self) -> None:
        self._save(clean=True)

    def restore(self) -> None:
        """Return every live object to the last commit."""
        start = time.perf_counter()
        with self.snapshot_lock:
            buffer, meta = self._committed(), self._meta
            done = self._unpack(buffer, range(len(buffer.views)), self._targets(meta))
        self._load(buffer.as_dict(), meta, done=done)
        self._mark_clean()
        self._emit("restore", seconds=time.perf_counter() - start, bytes=buffer.layout.nbytes)

    def sync(self) -> None:
        """Make every rank equal to rank 0's live state, and commit it locally.

        Collective.  Rank 0 sends its layout and small state while every other
        rank sends its lineage (one collective,
        :mod:`~hvd_elastic.training._internal.objects`).  When rank 0's live
        tensors may have moved since its last commit, restore or sync (something
        besides ``commit()`` checked for host updates, PyTorch's version counters
        moved, or a fused optimizer hides them), it copies them into its buffer
        first.  Then only what ranks lack moves
        (:mod:`~hvd_elastic.training._internal.sync`): the ranks outside rank 0's
        lineage are sent everything at once, while the ranks of the lineage
        prove with digests of their buffers which tensors they hold exactly,
        and what the digests show differs moves after.  Changes made through
        ``.data`` escape version counters: ``commit()`` after making them.
        """
        start = time.perf_counter()
        rank = comm.world()[0]
        layout, meta, lineage, sharers, copying, live = self._exchange_headers()
        targets = {} if rank == 0 else self._targets(meta)
        done: set[str] = set()
        with self.snapshot_lock:
            held = self._buffer is not None and self._buffer.layout == layout
            # A rank whose live tensors are its committed ones needs no unpacking of what it holds.
            clean = held and self._clean_versions is not None and self._clean_versions == compat.tensor_versions(live)
            buffer = self._buffer_for(layout)

            def unpack(indices: list[int]) -> None:
                # Straight into the live tensors while the next bucket is on the wire.
                done.update(self._unpack(buffer, indices, targets))

            moved = move(buffer, sharers=sharers, hashing=held and self._lineage == lineage, copying=copying,
                         live=live, unpack=unpack, bucket_bytes=self.bucket_bytes)
            self._meta = meta
            self._lineage = lineage
            if rank != 0:
                kept = [i for i in range(len(layout)) if i not in moved.plan.needs[rank]]
                if clean:
                    done.update(layout.specs[i].key for i in kept)
                else:  # its live tensors moved on since its commit: back to the committed ones
                    done.update(self._unpack(buffer, kept, targets))
        if rank != 0:
            self._load(buffer.as_dict(), meta, done=done)
        for component in self._components.values():
            component.after_sync(rank)
        self._mark_clean()
        self._apply_world()
        self._emit("sync", seconds=time.perf_counter() - start, bytes=moved.sent + moved.received,
                   sent_bytes=moved.sent, received_bytes=moved.received, transfer=moved.method,
                   receivers=len(moved.plan.receivers), plan=moved.proof, broadcast_seconds=moved.wire_seconds)

    def _exchange_headers(self) -> tuple[FlatLayout, dict, tuple, list[int], bool, list[torch.Tensor]]:
        """Collective, sync's first step: rank 0 offers its layout, small state and lineage, every other
        rank its lineage.  Returns rank 0's layout, small state and lineage, the other ranks of that
        lineage, whether this rank must copy its live tensors into its buffer (rank 0 only), and them."""
        if comm.world()[0] == 0:
            named, meta = self._capture()
            live = [t for _, t in named]
            # After a restore, or an interrupt raised by commit(), the live tensors ARE the
            # committed copy: nothing to copy, and the other ranks may hold it already.
            copying = self._clean_versions is None or self._clean_versions != compat.tensor_versions(live)
            with self.snapshot_lock:
                before = self._buffer
                layout = self._buffer_for(FlatLayout.of(named)).layout
                if self._buffer is not before:  # a new layout: nobody holds any of it
                    copying, self._lineage = True, transfer.new_lineage()
            # Copying keeps the lineage: the digests show whether the live tensors really moved.
            header = {"layout": layout.describe(), "meta": meta, "lineage": self._lineage}
            offers = allgather_object(header, name="hvd_elastic.sync.header")
        else:
            offers = allgather_object(self._lineage, name="hvd_elastic.sync.header")
            header = offers[0]
            layout, meta, copying = FlatLayout.parse(header["layout"]), header["meta"], False
            live = self._live_tensors()
        lineage = tuple(header["lineage"])
        # Only ranks of rank 0's lineage can hold its tensors; with none, nobody hashes.
        sharers = [r for r in range(1, len(offers)) if tuple(offers[r]) == lineage]
        return layout, meta, lineage, sharers, copying, live

    def reset(self) -> None:
        """Called by Horovod after every reset, before ``sync`` (which a removal-only reset skips)."""
        self._host_check.reset()
        self._apply_world()

    # -- snapshots ---------------------------------------------------------------------------

    def snapshot(self, copy: bool = False) -> dict[str, Any]:
        """The last committed state as a ``weights_only``-loadable nested dict.

        Without ``copy`` the tensors are views of the commit buffer: serialize
        them before the next commit, or hold :attr:`snapshot_lock` meanwhile.
        """
        with self.snapshot_lock:
            tensors = self._committed().as_dict()
            if copy:
                tensors = {k: v.clone() for k, v in tensors.items()}
            meta = self._meta
            components = {}
            for name in meta["components"]:
                prefix = name + "/"
                components[name] = {
                    "tensors": {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)},
                    "meta": meta["components"][name],
                }
            return {
                "format": SNAPSHOT_FORMAT,
                "commit_count": self.commit_count,
                "values": meta["values"],
                "policy": meta["policy"],
                "components": components,
            }

    def load_snapshot(self, snap: dict[str, Any]) -> None:
        """Apply a :meth:`snapshot` to the live objects and make it the committed state.

        Rank-local (rank 0 uses it to resume from a checkpoint, then ``sync``
        spreads it).  Resets :attr:`commit_count` to 0.
        """
        if not isinstance(snap, dict) or snap.get("format") != SNAPSHOT_FORMAT:
            found = snap.get("format") if isinstance(snap, dict) else type(snap).__name__
            raise ValueError(f"not a TrainingState snapshot: format {found!r}, expected {SNAPSHOT_FORMAT!r}")
        tensors = {}
        components = {}
        for name, part in snap["components"].items():
            components[name] = part["meta"]
            for key, tensor in part["tensors"].items():
                tensors[f"{name}/{key}"] = tensor
        meta = {"components": components, "values": snap["values"], "policy": snap["policy"]}
        self._load(tensors, meta, strict=False)
        self._save(clean=True)
        self._lineage = transfer.new_lineage()
        self.commit_count = 0

    # -- policy ------------------------------------------------------------------------------

    @property
    def accumulation_steps(self) -> int:
        """Backward passes per optimizer step under the batch policy (1 without one)."""
        if self.batch_policy is None:
            return 1
        return self.batch_policy.accumulation_steps(comm.world()[1])

    def _apply_world(self) -> None:
        """Fit sampler, LR and accumulation to the current world; idempotent."""
        rank, size = comm.world()
        fit_to_world(self.batch_policy, self._policy, rank=rank, size=size, initialized=comm.current() is not None,
                     optimizer=self.optimizer, schedulers=self.schedulers, sampler=self.sampler)

    # -- internals ------------------------------------------------------------------------

    def _capture(self) -> tuple[list[tuple[str, torch.Tensor]], dict[str, Any]]:
        """Live tensors (flattened, prefixed by component) and a detached copy of the small state."""
        named: list[tuple[str, torch.Tensor]] = []
        metas = {}
        for name, component in self._components.items():
            for key, tensor in component.tensors():
                named.append((f"{name}/{key}", tensor))
            metas[name] = component.meta()
            check_loadable(metas[name], f"{name}.state_dict()")
        values = tree_copy(self._values)
        for name, value in values.items():
            # Values changed in place (state.history.append(x)) pass no __setattr__.
            check_loadable(value, f"state.{name}")
        meta = {"components": metas, "values": values, "policy": dict(self._policy)}
        return named, meta

    def _committed(self) -> FlatBuffer:
        """The commit buffer, which the constructor's first save made (caller holds the lock)."""
        if self._buffer is None:
            raise RuntimeError("TrainingState has nothing committed: its constructor did not finish")
        return self._buffer

    def _buffer_for(self, layout: FlatLayout) -> FlatBuffer:
        """The commit buffer, reallocated when the layout changed (caller holds the lock)."""
        if self._buffer is None or self._buffer.layout != layout:
            self._buffer = None  # drop the old one first: never hold two on the host
            self._buffer = FlatBuffer(layout)
        return self._buffer

    def _save(self, clean: bool = False) -> tuple[float, int]:
        start = time.perf_counter()
        named, meta = self._capture()
        live = [t for _, t in named]
        with self.snapshot_lock:
            buffer = self._buffer
            if buffer is None or not buffer.layout.matches(named):
                buffer = self._buffer_for(FlatLayout.of(named))
            buffer.copy_from(live)
            self._meta = meta
            self._lineage = (self._lineage[0], self._lineage[1] + 1)
        # Only commit() vouches for the state: after construction the user may
        # still change weights in ways version counters miss (through .data).
        self._clean_versions = self._trackable_versions(live) if clean else None
        return time.perf_counter() - start, buffer.layout.nbytes

    def _live_tensors(self) -> list[torch.Tensor]:
        """The live tensors, in the order of this rank's layout (:meth:`_capture` without the small state)."""
        live: list[torch.Tensor] = []
        for component in self._components.values():
            live.extend(t for _, t in component.tensors())
        return live

    def _mark_clean(self) -> None:
        """Record that the live tensors equal the committed copy right now."""
        self._clean_versions = self._trackable_versions(self._live_tensors())

    def _trackable_versions(self, live: Sequence[torch.Tensor]) -> tuple | None:
        """Version counters of ``live``, or None when some writer bypasses them.

        Fused optimizer kernels update parameters and moments without bumping
        version counters; with one, sync always copies the live tensors.
        """
        optimizer = self.optimizer
        if optimizer is not None and any(g.get("fused") for g in optimizer.param_groups):
            return None
        return compat.tensor_versions(live)

    def _targets(self, meta: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Live tensors that committed tensors (by full key) can be copied into in place."""
        targets: dict[str, torch.Tensor] = {}
        for name, component in self._components.items():
            if name in meta["components"]:
                for key, tensor in component.targets(meta["components"][name]).items():
                    targets[f"{name}/{key}"] = tensor
        return targets

    def _unpack(self, buffer: FlatBuffer, indices: Sequence[int], targets: dict[str, torch.Tensor]) -> set[str]:
        """Copy committed tensors ``indices`` into their ``targets`` where shapes and dtypes fit.

        Returns the keys copied; :meth:`_load` skips those and creates the rest
        (optimizer state a rank does not have yet).
        """
        keys, dsts, srcs = [], [], []
        for i in indices:
            spec, view = buffer.layout.specs[i], buffer.views[i]
            target = targets.get(spec.key)
            if target is not None and target.shape == view.shape and target.dtype == view.dtype:
                keys.append(spec.key)
                dsts.append(target)
                srcs.append(view)
        copy_tensors(dsts, srcs)
        return set(keys)

    def _load(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any], strict: bool = True,
              done: Iterable[str] = frozenset()) -> None:
        """Load committed tensors and small state into the live objects; ``done`` keys are already in place."""
        by_component: dict[str, dict[str, torch.Tensor]] = {name: {} for name in self._components}
        for key, tensor in tensors.items():
            name, _, sub = key.partition("/")
            if name in by_component:
                by_component[name][sub] = tensor
            elif strict:
                raise ValueError(f"committed state has tensors for unknown component {name!r}")
        component_meta = meta["components"]
        missing = set(self._components) - set(component_meta)
        if missing:
            # Registered after that state was committed (or absent from a snapshot).
            log.log(logging.DEBUG if strict else logging.WARNING,
                    "no committed state for %s; keeping their live state", ", ".join(sorted(missing)))
        for name, component in self._components.items():
            if name in component_meta:
                prefix = name + "/"
                component.load(by_component[name], component_meta[name],
                               frozenset(k[len(prefix):] for k in done if k.startswith(prefix)))
        self._values.clear()
        self._values.update(tree_copy(meta["values"]))
        self._policy = dict(meta["policy"])


def broadcast_host_updates(update: tuple) -> tuple:
    """The host check's collective (``bcast_object`` of Horovod's ``State``): rank 0's (previous, newest
    notification time, what changed) to every rank.  It runs at every commit: one collective, where
    Horovod's ``broadcast_object`` takes two."""
    return broadcast_object(update, root_rank=0, name="hvd_elastic.host_updates")
