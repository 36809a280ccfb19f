"""``hvd-elastic drain``: put this node's service into maintenance (a graceful leave).

Every instance of ``--service`` on the LOCAL Consul agent (or just
``--service-id``) goes into maintenance (:mod:`hvd_elastic.nodeagent.drain`):
discovery stops listing the node and the job leaves it at its next reset,
without a rollback.

``--wait SECONDS`` then waits until the job has left the node (no Horovod
worker runs here any more, :mod:`hvd_elastic.nodeagent.leave`): what a Slurm
allocation or a Kubernetes ``preStop`` hook needs before it hands the node back.

Exit codes: 0 done (and, with ``--wait``, the job has left), 1 Consul failed or
no such service on this agent, 2 bad input, 3 workers still running when
``--wait`` ran out.
"""

from __future__ import annotations

import argparse

from hvd_elastic.nodeagent.drain import NotRegistered, default_reason, set_maintenance
from hvd_elastic.nodeagent.leave import wait_for_leave
from hvd_elastic.options import (
    CONSUL_FAILURES,
    add_consul_arguments,
    add_service_argument,
    command_name,
    consul_config,
    env,
    explain_failure,
    fail,
    non_negative_seconds,
)

#: Exit code of ``drain --wait`` when workers still ran at its end.
STILL_RUNNING = 3


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """Which service instances: the flags drain and undrain share."""
    add_service_argument(parser)
    parser.add_argument("--service-id", default=env("HVD_ELASTIC_SERVICE_ID"),
                        help="only this instance (env HVD_ELASTIC_SERVICE_ID; default every instance of --service on "
                             "this agent)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    parser.add_argument("--reason",
                        help="why, shown by `hvd-elastic status` and Consul (default: who drained it and when)")
    parser.add_argument("--wait", type=non_negative_seconds, default=0.0, metavar="SECONDS",
                        help="then wait up to SECONDS until no Horovod worker runs on this node "
                             "(exit 3 if some still do; default 0: do not wait)")
    add_consul_arguments(parser)


def set_and_say(args: argparse.Namespace, enable: bool, reason: str | None) -> int | None:
    """Maintenance on or off, one line per instance; an exit code when it failed, None when done."""
    try:
        targets = set_maintenance(consul_config(args), args.service, args.service_id, enable, reason)
    except CONSUL_FAILURES + (NotRegistered,) as exc:
        return explain_failure(command_name(args), exc)
    state = f"in maintenance ({reason})" if enable else "out of maintenance"
    for sid in targets:
        print(f"{sid}: {state}")
    return None


def run(args: argparse.Namespace) -> int:
    failed = set_and_say(args, True, args.reason or default_reason())
    if failed is not None:
        return failed
    if args.wait > 0:
        remaining = wait_for_leave(args.wait, on_wait=lambda pids: print(
            f"waiting up to {args.wait:g}s for {len(pids)} Horovod worker(s) to leave: "
            f"pids {' '.join(map(str, pids))}", flush=True))
        if remaining:
            return fail(command_name(args), f"{len(remaining)} Horovod worker(s) still running after {args.wait:g}s: "
                                            f"pids {' '.join(map(str, remaining))}", STILL_RUNNING)
        print("the job has left this node")
    return 0
