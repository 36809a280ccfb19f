"""Every use of a private Horovod or torch attribute, in one place, behind a version check.

hvd-elastic reaches into a few internals that neither project promises to
keep.  They live here and nowhere else, so an upgrade has one file to
re-check, and importing this module with versions it was not written for
fails AT IMPORT with one line naming what was found and what to do, instead
of an ``AttributeError`` in the middle of a reset.

=================================== ============================================
internal                            used for
=================================== ============================================
``horovod.common.elastic.            worker notifications of host changes
notification_manager``               (runner, elastic_loop)
``horovod.runner.elastic.worker.     what a host update was (added, removed...)
HostUpdateResult``
``DistributedOptimizer._handles``,   dropping in-flight allreduces after a failed
``_allreduce_delay``,                step (:func:`forget_pending_allreduces`); the
``_synchronized``,                   first two also tell Horovod's optimizer from
``_should_synchronize``              others (:func:`is_horovod_optimizer`, whose
                                     ``synchronize`` :mod:`.pace` times)
``LRScheduler._last_lr``             ``get_last_lr()`` after a policy rescales LRs
``Tensor._version``                  "unchanged since the commit" (sync fast path)
``torch._foreach_copy_``             one batched copy of many tensors
``State._last_updated_timestamp``,   ``TrainingState``'s host check (join-ahead's
``_host_messages``                   verdicts in place of Horovod's
                                     ``check_host_updates``)
=================================== ============================================

The couplings that are not attributes, so no import can check them; each is
checked where it is used, at run time, and named here so an upgrade re-checks
it too:

=================================== ============================================
coupling                            where, and how a change shows
=================================== ============================================
Gloo's TCP event loop: one epoll     :mod:`.gloo_hangup` (and so :mod:`.forksafe`,
per device watching a wake-up pipe   :mod:`.health_cut`); ``check_found`` warns
and only its pairs' TCP sockets,     once per run when a world of two or more
each registered with a handler       ranks shows no such loop
pointer as data
``horovod/common/elastic.py:         :mod:`.elastic_loop` is that loop with the
run_fn``: the retry loop             sync decision agreed by every rank; a changed
(restore on HorovodInternalError,    loop shows as resets that differ from Horovod's
keep on HostsUpdatedInterrupt,       own (``tests/training_run/test_elastic_loop.py``)
shutdown, rendezvous, on_reset,
sync)
horovodrun's environment for the     ``HOROVOD_HOSTNAME`` names a rank's host
workers: ``HOROVOD_HOSTNAME``,       (read by ``envvars.horovod_hostname`` only); every variable is copied
``HOROVOD_ELASTIC=1``, and every     onto the workers' ssh command lines, which is
launcher variable copied onto the    why a token in it is refused
ssh command line                     (:mod:`hvd_elastic.discovery.token_guard`)
horovodrun's elastic rendezvous      :mod:`.rendezvous`, :mod:`.join_ahead`;
server: ``GET /rank_and_size/        ``tests/training_run/test_join_ahead.py`` runs
HOST:LOCAL_RANK`` records the slot   them against Horovod's own server and
ready and waits for the driver's     handler, and the bed's joins
barrier; Gloo publishes each rank's  (``tests/multihost/test_standby_join.py``)
address at ``/global/RANK``;         against its driver: a changed protocol
``hvd.init()`` reads                 shows there; the driver rules' side
``HOROVOD_GLOO_RENDEZVOUS_ADDR``/    (:mod:`hvd_elastic.horovodrun.rules`: the
``_PORT`` with ``getenv``; any        store's ``cache``, ``_rank_assignments``,
answer but 200/404 makes Gloo's      Gloo's scope names) is gated by its own
store client retry three times and   ``SUPPORTED`` and shown by
throw (``http_store.cc``)            ``tests/horovodrun/``
the frame that iterates an           :func:`hvd_elastic.training.sampler.
``ExactlyOnceSampler`` (its          _refuse_as_plain_sampler` tells
``self``: a DataLoader iterator or   ``sampler=`` from ``batch_sampler=``;
a ``BatchSampler``), read with       ``tests/training_state/test_api_misuse.py``
``sys._getframe``                    shows a change
``multiprocessing.popen_fork.Popen.  :mod:`.forksafe` tells a daemonic
_launch``'s local ``process_obj``,   ``Process`` from other forks; were it moved,
read from the frame that forks       such children would merely not die with
                                     their parent (``tests/training_run/
                                     test_forksafe_unit.py``)
torch's lazy ``torch._dynamo``       :mod:`.preload` imports it before
import on the first                  ``hvd.init()``; were it no longer lazy, the
``Optimizer.add_param_group``        preload would merely import it early
(``torch._disable_dynamo``)
=================================== ============================================
"""

from __future__ import annotations

from typing import Any, Sequence, cast

import horovod
import torch

#: The versions these internals were checked against.
HOROVOD_VERSIONS = ("0.28.1",)
TORCH_VERSIONS = ((2, 1), (2, 13))  # inclusive (major, minor) range


def check_versions(horovod_version: str, torch_version: str) -> None:
    """Raise ImportError (one line: found, expected, the fix) unless both versions are supported."""
    found = []
    if horovod_version not in HOROVOD_VERSIONS:
        found.append(f"Horovod {horovod_version} (written for {', '.join(HOROVOD_VERSIONS)})")
    low, high = TORCH_VERSIONS
    if not low <= _major_minor(torch_version) <= high:
        found.append(f"torch {torch_version} (written for {low[0]}.{low[1]} to {high[0]}.{high[1]})")
    if found:
        raise ImportError(
            f"hvd_elastic.training._internal.compat uses private Horovod/torch attributes and found "
            f"{' and '.join(found)}: "
            f"install a supported version, or re-check every internal listed in {__file__} and widen its "
            f"HOROVOD_VERSIONS/TORCH_VERSIONS"
        )


def _major_minor(version: str) -> tuple[int, int]:
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (-1, -1)  # unparseable: outside every range


check_versions(horovod.__version__, torch.__version__)

from hvd_elastic.training._internal import preload  # noqa: E402,F401 -- its import is its work (its docstring)

from horovod.common.elastic import notification_manager  # noqa: E402 -- only once the versions are known good
from horovod.runner.elastic.worker import HostUpdateResult  # noqa: E402

__all__ = ["HostUpdateResult", "notification_manager", "forget_pending_allreduces", "is_horovod_optimizer",
           "set_last_lr", "tensor_versions", "foreach_copy", "check_versions"]


def is_horovod_optimizer(optimizer: Any) -> bool:
    """Whether ``optimizer`` is a Horovod ``DistributedOptimizer`` (whose class Horovod builds at run time, so
    it is told by its allreduce bookkeeping, not by a class)."""
    return hasattr(optimizer, "_handles") and hasattr(optimizer, "_allreduce_delay") and \
        callable(getattr(optimizer, "synchronize", None))


def forget_pending_allreduces(optimizer: torch.optim.Optimizer) -> None:
    """Drop a Horovod ``DistributedOptimizer``'s in-flight gradient allreduces.

    After a collective failed mid-step its handles are stale, and its
    ``zero_grad`` refuses to run while any exist.  Horovod resets them in its
    ``load_state_dict``; loading in place skips that method, so do the same
    here.  Any other optimizer is left alone.
    """
    if not hasattr(optimizer, "_handles") or not hasattr(optimizer, "_allreduce_delay"):
        return
    # Horovod builds its optimizer class at run time: these privates have no declared types
    hvd_optimizer = cast(Any, optimizer)
    hvd_optimizer._handles = {}
    hvd_optimizer._synchronized = False
    hvd_optimizer._should_synchronize = True
    for p in hvd_optimizer._allreduce_delay:
        hvd_optimizer._allreduce_delay[p] = hvd_optimizer.backward_passes_per_step


def set_last_lr(scheduler: Any, lrs: list[float]) -> None:
    """Make ``scheduler.get_last_lr()`` report ``lrs`` (schedulers without it are left alone)."""
    if hasattr(scheduler, "_last_lr"):
        scheduler._last_lr = list(lrs)


def tensor_versions(tensors: Sequence[torch.Tensor]) -> tuple:
    """Identity and in-place-modification counter of each tensor."""
    return tuple((t.data_ptr(), t._version) for t in tensors)


def foreach_copy(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> bool:
    """``torch._foreach_copy_(dsts, srcs)``; False when it is missing or refuses the lot
    (mixed strides or dtypes): the caller then copies tensor by tensor."""
    foreach = getattr(torch, "_foreach_copy_", None)
    if foreach is None:
        return False
    try:
        foreach(dsts, srcs)
    except (RuntimeError, TypeError):
        return False
    return True
