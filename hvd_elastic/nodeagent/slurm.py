"""What a node agent learns from the Slurm allocation it runs in, and a probe of the node's Slurm state.

Under Slurm the node agent runs as (or from) a worker job: one allocation of
one node, which registers the node in Consul while the allocation lasts.

* :func:`allocation` reads the job's ``SLURM_*`` variables: the slots are the
  GPUs Slurm gave the job on this node (``SLURM_GPUS_ON_NODE``, else the
  count of ``SLURM_JOB_GPUS``), and the service ID carries ``SLURM_JOB_ID``
  so two allocations on one node never overwrite each other's registration.
  A malformed variable is a ValueError naming it: guessing would advertise
  slots the job was not given.
* :class:`SlurmNodeProbe` (``--probe slurm``, on by default inside an
  allocation) turns critical when Slurm drains or downs the node
  (``scontrol update nodename=X state=drain``): discovery stops listing it and
  horovodrun removes it gracefully, as after ``hvd-elastic drain``.  A
  controller that does not answer is a warning, never critical: a slurmctld
  restart must not take every node out of the job.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from collections.abc import Mapping

from hvd_elastic.nodeagent.probes import CRITICAL, PASSING, WARNING, Probe, ProbeResult, ProbeSettings, register_probe

SCONTROL_TIMEOUT_S = 5.0
_INT = re.compile(r"\d+\Z")
# Slurm base states and flags that mean "no new work here" (scontrol prints e.g. MIXED+DRAIN, DOWN*).
_LEAVING = ("DRAIN", "DOWN", "FAIL", "MAINT", "REBOOT")


@dataclasses.dataclass(frozen=True)
class SlurmAllocation:
    job_id: str
    node_name: str
    gpus: int | None  # None: the job asked for no GPUs

    def service_id(self, service: str) -> str:
        return f"{service}-slurm-{self.job_id}"


def _count(name: str, value: str) -> int:
    if not _INT.match(value.strip()):
        raise ValueError(f"{name}={value!r} is not a GPU count (expected an integer >= 0)")
    return int(value)


def _gpu_list(name: str, value: str) -> int:
    """Count of ``SLURM_JOB_GPUS``: GPU indices, comma-separated (``0,1,3``)."""
    items = [item.strip() for item in value.split(",")]
    if not all(_INT.match(item) for item in items):
        raise ValueError(f"{name}={value!r} is not a list of GPU indices (expected e.g. 0,1,3)")
    return len(items)


def allocation(environ: Mapping[str, str]) -> SlurmAllocation | None:
    """The Slurm job this process runs in, None outside Slurm; ValueError for a malformed variable."""
    job_id = environ.get("SLURM_JOB_ID")
    if job_id is None:
        return None
    if not _INT.match(job_id):
        raise ValueError(f"SLURM_JOB_ID={job_id!r} is not a Slurm job ID (expected digits)")
    node = environ.get("SLURMD_NODENAME", "")
    if not node or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", node):
        raise ValueError(f"SLURMD_NODENAME={node!r} is not a Slurm node name (the allocation sets it)")
    gpus = None
    if environ.get("SLURM_GPUS_ON_NODE"):
        gpus = _count("SLURM_GPUS_ON_NODE", environ["SLURM_GPUS_ON_NODE"])
    elif environ.get("SLURM_JOB_GPUS"):
        gpus = _gpu_list("SLURM_JOB_GPUS", environ["SLURM_JOB_GPUS"])
    return SlurmAllocation(job_id=job_id, node_name=node, gpus=gpus)


def parse_node_state(text: str) -> tuple[str, str]:
    """``(State, Reason)`` from one line of ``scontrol show node -o``; ValueError if it has no State."""
    state = re.search(r"(?:^|\s)State=(\S+)", text)
    if state is None:
        raise ValueError(f"no State= in scontrol output: {text.strip()[:200]!r}")
    reason = re.search(r"(?:^|\s)Reason=(.*?)(?:\s+\w+=|$)", text)
    return state.group(1), (reason.group(1).strip() if reason else "")


@register_probe("slurm")
class SlurmNodeProbe(Probe):
    """Critical while Slurm drains, downs or fails this node (see the module docstring)."""

    def __init__(self, settings: ProbeSettings):
        if not settings.slurm_node:
            raise ValueError("the slurm probe needs a Slurm node name (SLURMD_NODENAME, set inside an allocation)")
        self.node = settings.slurm_node

    def check(self) -> ProbeResult:
        scontrol = shutil.which("scontrol")
        if scontrol is None:
            return ProbeResult(WARNING, "scontrol not found on PATH")
        try:
            done = subprocess.run([scontrol, "show", "node", "-o", self.node], capture_output=True, text=True,
                                  timeout=SCONTROL_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as exc:
            return ProbeResult(WARNING, f"scontrol failed: {exc}")
        if done.returncode != 0:
            return ProbeResult(WARNING, f"scontrol show node {self.node}: {(done.stderr or done.stdout).strip()[:200]}")
        try:
            state, reason = parse_node_state(done.stdout)
        except ValueError as exc:
            return ProbeResult(WARNING, str(exc))
        leaving = [flag for flag in _LEAVING if flag in state.upper()]
        if leaving:
            return ProbeResult(CRITICAL, f"Slurm node {self.node} is {state}" + (f" ({reason})" if reason else ""))
        return ProbeResult(PASSING, f"Slurm node {self.node} is {state}")
