"""Unit tests of the node agent's probes, GPU query parsing and size/meta parsing."""

from __future__ import annotations

import argparse

import pytest

from hvd_elastic.commands.node_agent import byte_size, deregister_after, meta_item
from hvd_elastic.nodeagent.probes import (
    CRITICAL,
    PASSING,
    PROBES,
    WARNING,
    DiskProbe,
    GpuInfo,
    GpuProbe,
    MemoryProbe,
    Probe,
    ProbeResult,
    ProbeSettings,
    load_probe,
    parse_gpu_query,
    run_probes,
)

H100 = "NVIDIA H100 80GB HBM3, 81559\n" * 8


@pytest.mark.parametrize(
    "visible,expected",
    [(None, 8), ("0,1,2,3", 4), ("", 0), ("-1", 0), ("0,1,2,3,4,5,6,7,8,9", 8), ("GPU-3f2a, GPU-77b1", 2)],
)
def test_gpu_query_respects_cuda_visible_devices(visible, expected):
    info = parse_gpu_query(H100, visible)
    assert info.count == expected
    if expected:
        assert (info.model, info.memory_mib) == ("NVIDIA H100 80GB HBM3", 81559)


def test_gpu_query_without_gpus_or_with_odd_output():
    assert parse_gpu_query("", None) == GpuInfo(0)
    assert parse_gpu_query("Tesla T4, [N/A]\n", None) == GpuInfo(1, "Tesla T4", 0)


class Fixed(Probe):
    def __init__(self, name, result):
        self.name, self.result = name, result

    def check(self):
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def test_run_probes_reports_the_worst_first():
    result = run_probes([
        Fixed("a", ProbeResult(PASSING, "fine")),
        Fixed("b", ProbeResult(CRITICAL, "disk full")),
        Fixed("c", ProbeResult(WARNING, "hot")),
    ])
    assert result.status == CRITICAL
    assert result.output == "b: disk full; c: hot; a: fine"


def test_a_crashing_probe_is_a_warning_not_a_crash():
    result = run_probes([Fixed("boom", RuntimeError("nvml gone")), Fixed("a", ProbeResult(PASSING, "fine"))])
    assert result.status == WARNING and "probe boom failed: RuntimeError: nvml gone" in result.output
    assert run_probes([]).status == PASSING


def test_builtin_probes_against_this_machine(tmp_path):
    assert set(PROBES) >= {"gpus", "memory", "disk"}
    assert MemoryProbe(ProbeSettings(min_free_memory=1)).check().status == PASSING
    assert MemoryProbe(ProbeSettings(min_free_memory=2**60)).check().status == CRITICAL
    assert DiskProbe(ProbeSettings(min_free_disk=1, checkpoint_path=str(tmp_path))).check().status == PASSING
    missing = DiskProbe(ProbeSettings(min_free_disk=1, checkpoint_path=str(tmp_path / "nope"))).check()
    assert missing.status == CRITICAL and "unusable" in missing.output
    assert GpuProbe(ProbeSettings(expected_gpus=0)).check().status == PASSING


def test_load_probe_by_name_or_factory():
    assert isinstance(load_probe("disk", ProbeSettings()), DiskProbe)
    assert isinstance(load_probe("hvd_elastic.nodeagent.probes:MemoryProbe", ProbeSettings()), MemoryProbe)
    for spec in ("nope", "os:getcwd", "no.such.module:f", "os:"):
        with pytest.raises(ValueError, match=repr(spec)):
            load_probe(spec, ProbeSettings())


@pytest.mark.parametrize("text,expected", [("512", 512), ("1K", 1024), ("2G", 2 * 2**30), ("1.5T", int(1.5 * 2**40)),
                                           ("10GiB", 10 * 2**30), ("3mb", 3 * 2**20)])
def test_byte_size(text, expected):
    assert byte_size(text) == expected


@pytest.mark.parametrize("bad", ["", "G", "-1G", "1P", "lots"])
def test_byte_size_rejects(bad):
    with pytest.raises(argparse.ArgumentTypeError):
        byte_size(bad)


def test_duration_and_meta_parsing():
    assert deregister_after("1m30s") == "1m30s"
    assert deregister_after("90s") == "1m30s" and deregister_after("1h") == "1h0m0s"  # as Consul prints it
    for bad in ("10 minutes", "30s", "59.9s", "-5m", ""):  # not a Go duration, or under Consul's 1m floor
        with pytest.raises(argparse.ArgumentTypeError, match="at least 1m"):
            deregister_after(bad)
    assert meta_item("rack=r7") == ("rack", "r7") and meta_item("empty=") == ("empty", "")
    for bad in ("novalue", "bad key=1", "k=" + "x" * 513):
        with pytest.raises(argparse.ArgumentTypeError):
            meta_item(bad)
