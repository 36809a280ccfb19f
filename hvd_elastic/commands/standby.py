"""``hvd-elastic standby``: import torch and horovod once, then fork this host's workers fast.

The standby itself is :class:`hvd_elastic.standby.server.Standby`; this module
reads its flags and runs it.  Exit codes: 0 after a stop, 1 when it cannot start
(a preload fails, the socket is taken), 2 for bad input; in a forked worker, the
worker's own code.
"""

from __future__ import annotations

import argparse
import logging

from hvd_elastic import sdnotify
from hvd_elastic.options import argparse_type, command_name, env, fail
from hvd_elastic.standby import child, protocol
from hvd_elastic.standby.server import Standby, StandbyError

log = logging.getLogger("hvd_elastic.standby.server")  # the standby's one logger name


def _modules(text: str) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    for name in names:
        if not all(part.isidentifier() for part in name.split(".")):
            raise argparse.ArgumentTypeError(f"{name!r} is not a module name")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", type=argparse_type(protocol.NAME),
                        default=env(protocol.NAME_ENV, protocol.DEFAULT_NAME),
                        help=f"the job's standby name, as its launchers say it (env {protocol.NAME_ENV}; "
                             "default %(default)s)")
    parser.add_argument("--preload", type=_modules, default=_modules(env("HVD_ELASTIC_STANDBY_PRELOAD") or ""),
                        metavar="MOD[,MOD...]",
                        help="the job's heavy modules to import ahead, beside torch, torch._dynamo and horovod.torch "
                             "(env HVD_ELASTIC_STANDBY_PRELOAD)")
    parser.epilog = (f"The socket is {protocol.DIR_ENV}, else $XDG_RUNTIME_DIR/hvd-elastic, else /tmp/hvd-elastic-UID, "
                     "/standby-NAME.sock.  Workers start through it with: "
                     "horovodrun ... hvd-elastic exec -- python train.py")


def run(args: argparse.Namespace) -> int:
    try:
        standby = Standby(args.name, args.preload)
        took = standby.prepare()
    except (StandbyError, OSError, ValueError) as exc:
        return fail(command_name(args), exc, 1)
    log.info("standby %r ready at %s after %.1f s of imports (%s)", args.name, standby.path, took,
             ", ".join(standby.preload))
    # Under systemd (Type=notify): the unit is started now, so units After= it (a node agent) start.
    sdnotify.notify(f"READY=1\nSTATUS=standby {args.name} ready at {standby.path}")
    task = standby.serve()
    if task is None:
        standby.close()
        log.info("standby %r stopped", args.name)
        return 0
    request, _ = task
    return child.run_worker(request)
