"""How discovery's commands report a failure to get or use their settings: one stderr line, one exit code.

Every command that reads those settings -- ``hvd-elastic discover`` (:mod:`.cli`),
its watcher (:mod:`.cachecli`), ``hvd-elastic status`` (:mod:`.status`) -- builds
them with :mod:`.variables` and reports the failures it lists
(:data:`~.variables.FAILURES`) here.
"""

from __future__ import annotations

from hvd_elastic.health import hosts as hostlib
from hvd_elastic.options import command_name
from hvd_elastic.options import explain_failure as _explain

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs time on discovery's direct path
if TYPE_CHECKING:
    import argparse


def explain_failure(args: argparse.Namespace, exc: Exception) -> int:
    """Print one stderr line for a failure in :data:`.variables.FAILURES` and return the exit code."""
    if isinstance(exc, hostlib.MalformedResponse):
        exc = hostlib.MalformedResponse(f"Consul's answer for service {args.service!r} is malformed: {exc}")
    return _explain(command_name(args), exc)
