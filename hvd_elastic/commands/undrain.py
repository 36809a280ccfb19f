"""``hvd-elastic undrain``: take this node's service out of maintenance.

The inverse of :mod:`.drain`, for the same instances; idempotent.  A drain
lifted here lets discovery list the node again, and the job takes it back at
its next reset.  Exit codes: 0 done, 1 Consul failed or no such service on
this agent, 2 bad input.
"""

from __future__ import annotations

import argparse

from hvd_elastic.commands.drain import add_target_arguments, set_and_say
from hvd_elastic.options import add_consul_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    add_consul_arguments(parser)


def run(args: argparse.Namespace) -> int:
    failed = set_and_say(args, False, None)
    return 0 if failed is None else failed
