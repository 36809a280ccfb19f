"""``hvd-elastic report RUN_DIR``: print a run's membership timeline and summary, and draw its PNG.

Works on any run of ``@hvd_elastic.run`` (see :mod:`hvd_elastic.report` for the
files it reads), finished or still being written.  Exit status: 0 when the
report was printed (skipped lines are warned about on stderr, one line each,
naming the file and line), 2 when the run directory or its event log is
missing, 1 when the picture could not be drawn or written (one line each;
without matplotlib, say so and how to get it).
"""

from __future__ import annotations

import argparse

from hvd_elastic.options import command_name, fail
from hvd_elastic.report.runlog import RunDirError
from hvd_elastic.report.summary import PNG_NAME, draw_png, make_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR",
                        help="the run's directory: events.jsonl, and progress.jsonl, actions.jsonl, ledger/ if any")
    parser.add_argument("--png", metavar="PATH", help=f"where to write the picture (default RUN_DIR/{PNG_NAME})")
    parser.add_argument("--no-png", action="store_true", help="print the table only")


def run(args: argparse.Namespace) -> int:
    prog = command_name(args)
    try:
        report = make_report(args.run_dir)
    except RunDirError as exc:
        return fail(prog, exc, 2)
    print(report.text)
    if args.no_png:
        return 0
    try:
        png = draw_png(report, args.png)
    except ImportError as exc:  # matplotlib is the demo extra's, not a requirement of the package
        return fail(prog, f"drawing the picture needs matplotlib ({exc.name or exc} is not importable): "
                          "pip install 'hvd-elastic[demo]', or pass --no-png for the table alone", 1)
    except OSError as exc:
        return fail(prog, f"cannot write the picture {args.png or ''}: {exc}", 1)
    print(f"picture: {png}")
    return 0
