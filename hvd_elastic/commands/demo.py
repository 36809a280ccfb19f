"""``hvd-elastic demo``: one elastic training job put through every kind of membership event, then judged.

What it runs is :mod:`hvd_elastic.demo.scenario`: Consul for three local nodes,
a node agent each, ``horovodrun`` over the discovery script, the ``--events``
schedule, and a plain process training the same model as the reference.

It ends with ``hvd-elastic report``'s timeline (recovery time and rolled-back
steps per event), the exactly-once verdict of the ranks' ledgers, the final
test accuracy next to the reference's, and where the files are.  Exit 0 only
when training finished and every one of those checks holds; 1 otherwise; 2 for
a schedule or flag that cannot work (refused before anything starts); 130
interrupted (Ctrl-C or SIGTERM: every process the demo started is ended).
"""

from __future__ import annotations

import argparse
import logging
import signal
import tempfile
import time
from pathlib import Path

from hvd_elastic.commands.node_agent import ttl_seconds  # the node agents' own rule: they get this TTL
from hvd_elastic.demo import scenario
from hvd_elastic.demo.live import Console
from hvd_elastic.options import (
    command_name,
    fail,
    non_negative_seconds,
    positive_int,
    positive_number,
    positive_seconds,
)
from hvd_elastic.report.jsonlines import JsonLines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", help="the run directory: checkpoints, logs, report (default: a new temporary one)")
    parser.add_argument("--events", default=scenario.schedule.DEFAULT,
                        help=f"comma-separated ACTION[:HOST] schedule, actions {', '.join(scenario.schedule.ACTIONS)} "
                             f"(default %(default)s)")
    parser.add_argument("--spare-host", help="name of the node the 'add' event brings in; it must resolve to an "
                                             "address of this machine (default this machine's host name)")
    parser.add_argument("--epochs", type=positive_int, default=6, help="training epochs (default %(default)s)")
    parser.add_argument("--phase-steps", type=positive_int, default=8,
                        help="steps to train at each new world size before the next event (default %(default)s)")
    parser.add_argument("--step-delay", type=non_negative_seconds, default=0.1,
                        help="seconds each step waits until the last event is done (default %(default)s)")
    parser.add_argument("--checkpoint-every", type=positive_int, default=10,
                        help="commits between durable checkpoints (default %(default)s)")
    parser.add_argument("--ttl", type=ttl_seconds, default=4.0,
                        help="node agents' TTL check, seconds: how soon a silent node drops (default %(default)s)")
    parser.add_argument("--accuracy-tolerance", type=positive_number, default=0.03,
                        help="largest accepted gap between elastic and uninterrupted test accuracy "
                             "(default %(default)s)")
    parser.add_argument("--standby", action=argparse.BooleanOptionalAction, default=True,
                        help="start workers from a warm standby (hvd-elastic standby), so a join does not stop the "
                             "survivors for the newcomer's imports; --no-standby starts them directly (default on)")
    parser.add_argument("--consul", choices=("auto", "dev", "consul"), default="auto",
                        help="what the nodes register in: HashiCorp Consul agents (a server and a client agent per "
                             "node, the binary bootstrap fetched), the embedded dev agent, or auto: HashiCorp's when "
                             "its binary is there, else the dev agent (default %(default)s)")
    parser.add_argument("--timeout", type=positive_seconds, default=180.0,
                        help="seconds each phase may take before the demo gives up (default %(default)s)")


def run(args: argparse.Namespace) -> int:
    try:
        plan = scenario.plan(args)
    except (scenario.schedule.ScheduleError, ValueError) as exc:
        return fail(command_name(args), exc, 2)
    # The dev agent's per-node start/stop lines would interleave with the demo's own story.
    logging.getLogger("hvd_elastic.devagent").setLevel(max(logging.WARNING, logging.getLogger().level))
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="hvd-elastic-demo."))
    workdir.mkdir(parents=True, exist_ok=True)
    console = Console(JsonLines(workdir / "progress.jsonl"))
    console.say(f"run directory {workdir}")
    start = time.monotonic()
    # SIGTERM unwinds like Ctrl-C, so every process the demo started is ended (hvd-elastic exits 130).
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        scenario.run_demo(args, workdir, plan, console)
        passed = scenario.summary(args, workdir, console)
    except scenario.DemoFailed as exc:
        console.say(f"FAILED: {exc}")
        return fail(command_name(args), f"FAILED: {exc}", 1)
    finally:
        signal.signal(signal.SIGTERM, previous)
    console.say(f"demo {'OK' if passed else 'FAILED'} in {time.monotonic() - start:.0f} s")
    return 0 if passed else 1


def _interrupt(signum, frame):
    raise KeyboardInterrupt
