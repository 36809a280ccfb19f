"""The ``torchrun.handlers`` entry point named ``consul`` (``setup.cfg``).

torch calls ``handler_creator()`` while importing ``torch.distributed.elastic.rendezvous``, in every process
that imports it (every training worker too), and registers what it returns under the entry point's name.  So
this module imports nothing, and the creator loads the backend only when a rendezvous is asked for.

A bad rendezvous parameter on torchrun's command line ends torchrun with one line on stderr and exit code 2
(a usage error), not a traceback; a program that launches agents itself gets the exception.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters


def handler_creator() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """What torch registers as the ``consul`` backend: parameters -> rendezvous handler."""
    return _create


def _create(params: RendezvousParameters) -> RendezvousHandler:
    from hvd_elastic.torchrun.handler import create
    from hvd_elastic.torchrun.settings import RendezvousSettingsError

    try:
        return create(params)
    except RendezvousSettingsError as exc:
        if not _on_torchruns_command_line():
            raise
        print(f"torchrun --rdzv-backend consul: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _on_torchruns_command_line() -> bool:
    """Whether this process is the ``torchrun`` command (or ``python -m torch.distributed.run``)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return (spec is not None and spec.name == "torch.distributed.run") or \
        bool(sys.argv) and sys.argv[0].rpartition("/")[2] == "torchrun"
