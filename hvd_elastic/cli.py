"""The ``hvd-elastic`` command line.

Each subcommand is one module of :mod:`hvd_elastic.commands`, named after it
(``node-agent`` is ``hvd_elastic/commands/node_agent.py``), which provides::

    def add_arguments(parser: argparse.ArgumentParser) -> None
    def run(args: argparse.Namespace) -> int      # the process exit code

Modules are imported only when their subcommand runs, so a fast path such as
``hvd-elastic discover`` (called by horovodrun every second) never pays for
importing torch or horovod.

Exit codes follow the usual conventions: 0 success, 1 the operation failed,
2 bad usage or bad input (argparse's own code), 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from hvd_elastic import __version__
from hvd_elastic.options import LOG_LEVELS, env, log_level, one_line_errors

PACKAGE = "hvd_elastic.commands"

# name -> one-line help; the module is PACKAGE's file of the same name, dashes as underscores.
# Order is the order shown by --help.
COMMANDS: dict[str, str] = {
    "doctor": "check what this node needs to run elastic training",
    "consul-dev": "run the Consul-compatible development agent",
    "discover": "print healthy hosts as host:slots (for horovodrun)",
    "node-agent": "register this node in Consul and keep its health check alive",
    "drain": "put this node's service into maintenance (graceful leave)",
    "undrain": "take this node's service out of maintenance",
    "status": "show the service's nodes, slots, health and what discovery prints",
    "standby": "import torch and horovod once, then fork this host's workers fast",
    "exec": "run a worker command through this host's standby (horovodrun's command)",
    "launch": "run horovodrun, and relaunch it when the job dies (it resumes from its checkpoint)",
    "demo": "run the elastic training demo on an embedded Consul dev agent",
    "report": "print a run's membership timeline and summary, and draw its PNG",
}


def module_name(command: str) -> str:
    """``node-agent`` -> ``hvd_elastic.commands.node_agent``."""
    return f"{PACKAGE}.{command.replace('-', '_')}"


def _load(name: str):
    return importlib.import_module(module_name(name))


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Build the parser; with ``only`` set, import just that subcommand's module."""
    parser = argparse.ArgumentParser(
        prog="hvd-elastic",
        description="Elastic Horovod training for PyTorch with Consul host discovery.",
    )
    parser.add_argument("--version", action="version", version=f"hvd-elastic {__version__}")
    parser.add_argument(
        "--log-level",
        type=log_level,
        metavar="{" + ",".join(LOG_LEVELS) + "}",
        default=env("HVD_ELASTIC_LOG_LEVEL", "INFO"),
        help="logging level (env HVD_ELASTIC_LOG_LEVEL; default %(default)s)",
    )
    # A bad global option (HVD_ELASTIC_LOG_LEVEL=trace) still names the subcommand that was run.
    one_line_errors(parser, prog=f"{parser.prog} {only}" if only else None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        one_line_errors(sp)  # bad input: one stderr line naming the value, exit 2 (--help still shows usage)
        if name == only:
            module = _load(name)
            module.add_arguments(sp)
            sp.set_defaults(_module=module, _prog=sp.prog)  # errors at run time name the command the same way
    return parser


def _subcommand(argv: list[str]) -> str | None:
    # The first known command word; anything before it is a global option.
    return next((arg for arg in argv if arg in COMMANDS), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(only=_subcommand(argv))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args._module.run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
