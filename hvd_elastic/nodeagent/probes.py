"""Local health probes of a training node, and the hardware facts it advertises.

A probe answers one question about this node ("are the GPUs still there?",
"is there room for a checkpoint?") with a :class:`ProbeResult`.  The node agent
runs every configured probe before each TTL update and reports the worst
result, so Consul -- and through it horovodrun -- stops using a node whose
probe fails.

Probes are pluggable: built-in ones are registered by name in :data:`PROBES`
(``gpus``, ``memory``, ``disk``; ``slurm`` in :mod:`.slurm`, ``standby`` in
:mod:`.standby`); ``--probe
module:factory`` loads another one.
A factory is called with the :class:`ProbeSettings` and returns a
:class:`Probe`.  A probe that raises is reported as ``warning`` (its own
failure says nothing certain about the node).
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

PASSING, WARNING, CRITICAL = "passing", "warning", "critical"
_SEVERITY = {PASSING: 0, WARNING: 1, CRITICAL: 2}
GPU_QUERY_TIMEOUT_S = 10.0


class ProbeResult(NamedTuple):
    status: str  # passing, warning or critical
    output: str  # why; becomes the TTL check's Output


@dataclasses.dataclass(frozen=True)
class ProbeSettings:
    expected_gpus: int = 0
    min_free_memory: int = 0  # bytes
    min_free_disk: int = 0  # bytes
    checkpoint_path: str = "."
    slurm_node: str = ""  # inside a Slurm allocation: this node's Slurm name
    standby_name: str = ""  # the job's warm standby on this node (:mod:`.standby`)
    standby_wait: float = 120.0  # seconds the node waits for it before joining without


class Probe(abc.ABC):
    """One health question about this node."""

    name: str = "probe"

    @abc.abstractmethod
    def check(self) -> ProbeResult:
        """Answer now; must return within a few seconds."""


ProbeFactory = Callable[[ProbeSettings], Probe]
PROBES: dict[str, ProbeFactory] = {}


def register_probe(name: str) -> Callable[[type[Probe]], type[Probe]]:
    """Class decorator adding a probe to :data:`PROBES` under ``name``."""

    def add(cls: type[Probe]) -> type[Probe]:
        cls.name = name
        PROBES[name] = cls
        return cls

    return add


@dataclasses.dataclass(frozen=True)
class GpuInfo:
    count: int
    model: str = ""
    memory_mib: int = 0


def query_gpus() -> GpuInfo:
    """GPUs this node shows through ``nvidia-smi``, limited by CUDA_VISIBLE_DEVICES.

    No ``nvidia-smi`` (or a failing one) means no GPUs.  torch is not imported:
    it is slow to import and would create a CUDA context in a long-lived process.
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return GpuInfo(0)
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=GPU_QUERY_TIMEOUT_S, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return GpuInfo(0)
    return parse_gpu_query(out, os.environ.get("CUDA_VISIBLE_DEVICES"))


def parse_gpu_query(csv_text: str, cuda_visible_devices: str | None) -> GpuInfo:
    """GpuInfo from ``nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits``.

    The count is capped by the devices CUDA_VISIBLE_DEVICES lists (``-1`` or an
    empty value hides them all); model and memory are the first GPU's.
    """
    rows = [[field.strip() for field in line.split(",")] for line in csv_text.splitlines() if line.strip()]
    count = len(rows)
    if cuda_visible_devices is not None:
        visible = [d.strip() for d in cuda_visible_devices.split(",")]
        count = 0 if "-1" in visible else min(count, len([d for d in visible if d]))
    if not count:
        return GpuInfo(0)
    model, memory = (rows[0] + ["", "0"])[:2]
    return GpuInfo(count, model, int(memory) if memory.isdigit() else 0)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


@register_probe("gpus")
class GpuProbe(Probe):
    """Critical when fewer GPUs are visible than when the agent started."""

    def __init__(self, settings: ProbeSettings):
        self.expected = settings.expected_gpus

    def check(self) -> ProbeResult:
        if self.expected <= 0:
            return ProbeResult(PASSING, "no GPUs expected")
        seen = query_gpus().count
        if seen < self.expected:
            return ProbeResult(CRITICAL, f"{seen} of {self.expected} GPUs visible")
        return ProbeResult(PASSING, f"{seen} GPUs visible")


@register_probe("memory")
class MemoryProbe(Probe):
    """Critical when available memory drops below the threshold."""

    def __init__(self, settings: ProbeSettings):
        self.minimum = settings.min_free_memory

    def check(self) -> ProbeResult:
        import psutil

        free = psutil.virtual_memory().available
        if free < self.minimum:
            return ProbeResult(CRITICAL, f"free memory {_gib(free)} is below {_gib(self.minimum)}")
        return ProbeResult(PASSING, f"free memory {_gib(free)}")


@register_probe("disk")
class DiskProbe(Probe):
    """Critical when the checkpoint path's file system has too little free space."""

    def __init__(self, settings: ProbeSettings):
        self.path, self.minimum = settings.checkpoint_path, settings.min_free_disk

    def check(self) -> ProbeResult:
        import psutil

        try:
            free = psutil.disk_usage(self.path).free
        except OSError as exc:
            return ProbeResult(CRITICAL, f"checkpoint path {self.path!r} unusable: {exc.strerror or exc}")
        if free < self.minimum:
            return ProbeResult(CRITICAL, f"free disk on {self.path} {_gib(free)} is below {_gib(self.minimum)}")
        return ProbeResult(PASSING, f"free disk on {self.path} {_gib(free)}")


def load_probe(spec: str, settings: ProbeSettings) -> Probe:
    """A probe by registered name, or ``module:factory``; raises ValueError naming the spec."""
    if spec in PROBES:
        return PROBES[spec](settings)
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"unknown probe {spec!r} (expected one of {', '.join(sorted(PROBES))} or module:factory)")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load probe {spec!r}: {exc}") from None
    try:
        probe = factory(settings)
    except Exception as exc:  # noqa: BLE001 - any plugin error is bad input, reported as such
        raise ValueError(f"probe {spec!r} failed to start: {type(exc).__name__}: {exc}") from None
    if not isinstance(probe, Probe):
        raise ValueError(f"probe {spec!r} returned {type(probe).__name__}, expected a Probe")
    return probe


def run_probes(probes: Sequence[Probe], observe: Callable[[str, str, float], None] | None = None) -> ProbeResult:
    """The worst result of all probes; outputs joined, failing ones first.

    ``observe(name, status, seconds)`` is called after each probe (metrics).
    """
    results = []
    for probe in probes:
        started = time.monotonic()
        try:
            result = probe.check()
        except Exception as exc:  # noqa: BLE001 - a broken probe must not kill the agent
            result = ProbeResult(WARNING, f"probe {probe.name} failed: {type(exc).__name__}: {exc}")
        if observe is not None:
            observe(probe.name, result.status, time.monotonic() - started)
        results.append((probe.name, result))
    if not results:
        return ProbeResult(PASSING, "no probes configured")
    results.sort(key=lambda item: -_SEVERITY.get(item[1].status, 2))
    worst = results[0][1].status
    return ProbeResult(worst, "; ".join(f"{name}: {r.output}" for name, r in results))
