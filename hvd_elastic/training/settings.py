"""A training process's switches: one typed, frozen object, read from the environment once and passed down.

A worker has no command line of its own (the user's script is the
command), so its settings are variables, which horovodrun, torchrun,
Slurm and Kubernetes all pass on.  :func:`from_environment` reads
:data:`VARIABLES` into :class:`WorkerSettings` where a job enters
hvd-elastic: :class:`~hvd_elastic.training.state.TrainingState`'s
construction, or ``@hvd_elastic.run`` for Horovod's own states.  The
modules below take the values they need from that object; none reads a
variable of this table itself (``tests/training_run/test_settings.py``).

Contract:

* A set variable that is not of its type is a :class:`ConfigError` naming
  it, its value and what was expected, raised at that read: before any
  training.  Blank is unset.
* Except the health cut's two: a bad ``HVD_ELASTIC_HEALTH_CUT`` or
  ``HVD_ELASTIC_HEALTH_GRACE`` is one warning and the cut off, since a
  health watch is never a reason to stop training.
* ``HVD_ELASTIC_CHECKPOINT_WRITE_DELAY`` is no setting of a job: a test
  hook that the checkpoint writer reads at each write, so a test can stall
  writes mid-run (:mod:`hvd_elastic.training.checkpoint`).

The variables of discovery's health query, which the health cut also
follows, are discovery's table (:mod:`hvd_elastic.health.variables`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping

from hvd_elastic.envvars import BOOLEAN, NON_NEGATIVE_SECONDS, POSITIVE_INT, TEXT, Check, ConfigError
from hvd_elastic.health.lost import DEFAULT_GRACE_S, GRACE_ENV
from hvd_elastic.metrics.address import ENV as METRICS_ADDR_ENV

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Variable:
    """One row of the table: the variable, the settings field it fills, its type, default (as text) and meaning."""

    name: str
    field: str
    check: Check
    default: str
    meaning: str


JOIN_AHEAD_ENV, GLOO_HANGUP_ENV = "HVD_ELASTIC_JOIN_AHEAD", "HVD_ELASTIC_GLOO_HANGUP"
HEALTH_CUT_ENV, FORK_SAFETY_ENV = "HVD_ELASTIC_HEALTH_CUT", "HVD_ELASTIC_FORK_SAFETY"
CHECKPOINT_LOCAL_ENV = "HVD_ELASTIC_CHECKPOINT_LOCAL"
STRAGGLER_ENV, STRAGGLER_THRESHOLD_ENV = "HVD_ELASTIC_STRAGGLER", "HVD_ELASTIC_STRAGGLER_THRESHOLD"
STRAGGLER_WINDOW_ENV, STRAGGLER_WINDOWS_ENV = "HVD_ELASTIC_STRAGGLER_WINDOW", "HVD_ELASTIC_STRAGGLER_WINDOWS"
#: What the straggler detector may do (:mod:`hvd_elastic.training._internal.pace`, ``.straggler_drain``).
STRAGGLER_POLICIES = ("off", "report", "drain")
#: The straggler settings' types, shared by their variables and ``RunConfig``'s fields (one rule, two spellings).
STRAGGLER_POLICY = Check(str, lambda v: v in STRAGGLER_POLICIES, f"one of {', '.join(STRAGGLER_POLICIES)}")
STRAGGLER_THRESHOLD = Check(float, lambda v: 1 < v < float("inf"), "a number > 1")
STRAGGLER_COUNT = POSITIVE_INT
VARIABLES = (
    Variable(JOIN_AHEAD_ENV, "join_ahead", BOOLEAN, "true",
             "When hosts are only added, the survivors ask horovodrun's driver for their places in the next world "
             "at once and keep training until the newcomers wait at its rendezvous. `0` turns it off (the stock "
             "path: everyone stops at the commit)."),
    Variable(GLOO_HANGUP_ENV, "gloo_hangup", BOOLEAN, "true",
             "After a failure a survivor whose Horovod failed hangs up its Gloo connections once they have been "
             "quiet for 0.2 s, so no other survivor waits out the Gloo timeout on it. `0` turns the hang-up off, "
             "and with it the health cut (a cut is a hang-up)."),
    Variable(HEALTH_CUT_ENV, "health_cut", BOOLEAN, "true",
             "The first rank of every host follows the hosts' health in Consul and hangs up its Gloo connections "
             "to a host that is lost (critical, not in maintenance, for `HVD_ELASTIC_HEALTH_GRACE`) and silent (no "
             "data for 2 s). `0` turns the cut off (and silences the one log line of a job without Consul); a bad "
             "value is one warning and the cut off."),
    Variable(GRACE_ENV, "health_grace", NON_NEGATIVE_SECONDS, f"{DEFAULT_GRACE_S:g}",
             "A host is lost only once every Consul answer for this long has it failed. Also read by the "
             "launcher's discovery watcher; in a worker a bad value is one warning and the cut off."),
    Variable(FORK_SAFETY_ENV, "fork_safety", BOOLEAN, "true",
             "Every child forked with `os.fork()` or multiprocessing's `fork` start method releases the Gloo "
             "connections it inherited, and daemonic multiprocessing children of the main thread (DataLoader "
             "workers) die with their rank. `0` turns this off."),
    Variable(CHECKPOINT_LOCAL_ENV, "checkpoint_local", BOOLEAN, "false",
             "True says `checkpoint_dir` is local on purpose (one host; checkpoints copied away by other means) and "
             "skips the check that every rank sees it, as `run(..., checkpoint_dir_shared=False)` does; rank 0's "
             "value decides. Default false: a directory some rank does not see stops the job with "
             "`SharedDirError`."),
    Variable(METRICS_ADDR_ENV, "metrics_addr", TEXT, "",
             "`[HOST]:PORT` where rank 0 of `@hvd_elastic.run` serves the job's Prometheus metrics when "
             "`RunConfig(metrics_addr=...)` is not given; a bare port binds loopback. Unset: no metrics served."),
    Variable(STRAGGLER_ENV, "straggler", STRAGGLER_POLICY, "report",
             "What `@hvd_elastic.run` does about a host whose own work per step is well above the job's median "
             "(a straggler): `report` measures every rank, gathers the figures once per window and, for a host slow "
             "in `HVD_ELASTIC_STRAGGLER_WINDOWS` windows in a row, writes a `straggler` event and a warning and "
             "sets its relative-speed gauge; it never acts. `drain` does the same and asks the slowest such host's "
             "node agent, through Consul, to drain it (one host per window, never below `--min-np`, never the only "
             "host); the node agent readmits it after `--straggler-cooldown`. `off` measures nothing. "
             "`RunConfig(straggler=...)` wins; rank 0's value decides."),
    Variable(STRAGGLER_THRESHOLD_ENV, "straggler_threshold", STRAGGLER_THRESHOLD, "1.5",
             "A host is slow in a window when its median own work per step is at least this many times the job's "
             "median (and above the median by 3 scaled MADs of the ranks' figures)."),
    Variable(STRAGGLER_WINDOW_ENV, "straggler_window", STRAGGLER_COUNT, "50",
             "Commits per window: each rank's figures are gathered once per window (one small allgather), never "
             "per step."),
    Variable(STRAGGLER_WINDOWS_ENV, "straggler_windows", STRAGGLER_COUNT, "3",
             "Windows in a row a host must be slow in before it is reported (once per streak)."),
)
_HEALTH = ("health_cut", "health_grace")  # a bad value turns the cut off instead of stopping the job
BY_FIELD = {variable.field: variable for variable in VARIABLES}


@dataclasses.dataclass(frozen=True)
class WorkerSettings:
    """Every switch of :data:`VARIABLES`, typed; the defaults are the table's."""

    join_ahead: bool = True
    gloo_hangup: bool = True
    health_cut: bool = True
    health_grace: float = DEFAULT_GRACE_S
    fork_safety: bool = True
    checkpoint_local: bool = False
    metrics_addr: str = ""
    straggler: str = "report"
    straggler_threshold: float = 1.5
    straggler_window: int = 50
    straggler_windows: int = 3


def from_environment(environ: Mapping[str, str] | None = None) -> WorkerSettings:
    """:class:`WorkerSettings` from the variables (see the module's contract).  Raises ConfigError naming
    the first bad variable but the health cut's."""
    environ = os.environ if environ is None else environ
    values = {v.field: v.check.read(v.name, v.default, environ) for v in VARIABLES if v.field not in _HEALTH}
    try:
        health = {v.field: v.check.read(v.name, v.default, environ) for v in VARIABLES if v.field in _HEALTH}
    except ConfigError as exc:
        log.warning("health cut off: %s", exc)
        health = {"health_cut": False, "health_grace": DEFAULT_GRACE_S}
    return WorkerSettings(**values, **health)
