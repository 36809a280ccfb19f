"""The ``hvd-elastic`` console script.

horovodrun may run ``hvd-elastic discover`` every second for a whole job, so
that one word is routed to discovery's warm path (:mod:`hvd_elastic.discovery.fast`:
the job's host cache, read before any flag is parsed) before the command line
module and its argparse and logging are imported; ``hvd-elastic exec`` (every
worker start, :mod:`hvd_elastic.commands.exec`) goes straight to the launcher.  Everything else, and a
discovery call the cache cannot answer, goes to :func:`hvd_elastic.cli.main`: this is the only place
``hvd-elastic discover`` reads the job's cache, the full command line never looks again.
"""

from __future__ import annotations

import sys


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] == ["discover"]:
        from hvd_elastic.discovery import fast

        code = fast.answer(argv[1:])
        if code is not None:
            return code
    if argv[:1] == ["exec"]:  # every worker start: stdlib only, before argparse and logging
        from hvd_elastic.commands import exec as exec_command

        return exec_command.main(argv[1:])
    from hvd_elastic.cli import main as cli_main

    return cli_main(argv)
