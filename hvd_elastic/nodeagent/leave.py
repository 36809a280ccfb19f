"""Waiting for the job to leave this node after a drain.

A drain only asks: discovery stops listing the node, horovodrun removes it at
the job's next reset, and the node's workers exit.  Whoever must hand the node
back (a Slurm allocation at preemption or time limit, a Kubernetes pod's
``preStop`` hook) has to know when that has happened, and must not wait past
its own deadline: after it comes SIGKILL, and a worker killed mid-step costs
the job a rollback, which the drain was there to avoid.

A Horovod worker is recognised by what horovodrun puts in its environment
(:data:`WORKER_MARKERS`); ``ssh`` launches them outside any scheduler's
process tracking, so the process table is the only place that knows.  A
worker forked by a standby (:mod:`hvd_elastic.standby`) shows the standby's
environment there, but its launcher, ``hvd-elastic exec``, carries horovodrun's
and lives as long as the worker: it is counted in the worker's place.  Only
processes in this process's network namespace count: that is the node as the
job sees it (the address horovodrun reached over ssh), the same on a bare
host and in a pod, and it keeps hosts that share one kernel's process table
(containers with their own network, the test bed's hosts) apart.  Reading
another user's environment needs that user or root: processes we may not read
are not counted, which is right for the node agent running as the training
user or as root.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import psutil

#: Environment variables every horovodrun-launched worker has (Gloo and MPI controllers).
WORKER_MARKERS = ("HOROVOD_HOSTNAME", "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_RANK")

POLL_S = 0.5


def _network_namespace(pid: int | str) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def local_workers() -> list[int]:
    """Pids of the Horovod workers running on this node (this process never counted)."""
    me, here = os.getpid(), _network_namespace("self")
    pids = []
    for proc in psutil.process_iter():
        try:
            if (proc.pid != me and any(name in proc.environ() for name in WORKER_MARKERS)
                    and _network_namespace(proc.pid) == here):
                pids.append(proc.pid)
        except (psutil.Error, OSError):  # gone, a zombie, or not ours to read
            continue
    return sorted(pids)


def wait_for_leave(timeout: float, *, poll: float = POLL_S, workers: Callable[[], list[int]] = local_workers,
                   on_wait: Callable[[list[int]], None] | None = None) -> list[int]:
    """Wait until no worker runs here, at most ``timeout`` seconds; the pids still running (empty: left).

    ``on_wait`` is called once with the pids found first, if any (for a log line).
    """
    deadline = time.monotonic() + timeout
    remaining = workers()
    if remaining and on_wait is not None:
        on_wait(remaining)
    while remaining and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(poll, left))
        remaining = workers()
    return remaining
