"""The short chaos soak (:mod:`testbed.chaos`): 20 overlapping random faults on one job, nothing lost.

One soak with a fixed seed (the same schedule in every CI run, printed and
carried in every failure message, so a failure replays with
``benchmarks/chaos_soak.py --seed SEED``); the variety of schedules is the
long soak's job, which draws 200 and more.  It must end with the fault
matrix's verdict on the whole run (no hang, every sample once, identical
state, no durable checkpoint lost), no straggler drain (the job runs policy
``drain`` and no host is slow) and nothing of the bed left behind.  The
faults after which the job took longer than the bound are printed, not
judged: timings belong to the benchmark.  The long soak (200+ faults) is
``benchmarks/chaos_soak.py``.
"""

from __future__ import annotations

import os
import subprocess

import psutil
import pytest

from testbed.chaos import Soak, SoakConfig, format_summary
from testbed.multihost import ElasticCluster
from testbed.netns import PREFIX

# A soak is minutes of faults, then the stop at an epoch's end: above pytest's 600 s default
# (pyproject.toml), below its hang limit plus set-up and teardown.
pytestmark = [pytest.mark.slow, pytest.mark.multihost, pytest.mark.timeout(1800)]

FIXED_SEED = 20261203


def left_behind(workdir) -> list[str]:
    """The bed's namespaces and the processes running from ``workdir`` still alive after teardown."""
    spaces = [line.split()[0] for line in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                         text=True).stdout.splitlines()
              if line.startswith(PREFIX)]
    procs = []
    for proc in psutil.process_iter(["cmdline", "pid"], ad_value=None):
        if proc.pid != os.getpid() and str(workdir) in " ".join(proc.info["cmdline"] or ()):
            procs.append(f"{proc.pid} {' '.join(proc.info['cmdline'])[:120]}")
    return spaces + procs


def test_twenty_overlapping_faults_lose_nothing(tmp_path, reliability):
    seed = FIXED_SEED
    print(f"chaos soak seed {seed} (replay: benchmarks/chaos_soak.py --seed {seed} --faults 20 --mtbf 10)")
    config = SoakConfig(seed=seed, faults=20, mtbf=10.0, hold=(2.0, 10.0))
    with ElasticCluster(tmp_path, hosts=config.hosts, ttl=config.ttl, gloo_timeout=config.gloo_timeout) as cluster:
        cluster.wait_discovered([f"{h}:1" for h in cluster.bed.hosts])
        soak = Soak(cluster, config)
        soak.start()
        soak.run()
        summary = soak.finish()
    print(format_summary(summary))
    print("\n".join(f"slow: {line}" for line in summary["slow"]))  # listed, not judged: a timing, not a promise
    if summary["not_back"]:  # a finding to chase (printed with what discovery saw), not a broken promise
        print(f"seed {seed}: the job did not grow back to every host: {summary['not_back']}")
    reliability({"fault": f"chaos soak, seed {seed}", "injected": summary["injected"],
                 "survived": not summary["problems"], "lost": summary["lost"], "duplicated": summary["duplicated"],
                 "identical": summary["identical"]})
    assert summary["injected"] == config.faults, f"seed {seed}: {format_summary(summary)}"
    assert not summary["problems"], f"seed {seed}: {summary['problems']}"
    assert summary["false_drains"] == [], f"seed {seed}: no host was slow, yet drained: {summary['false_drains']}"
    assert not left_behind(tmp_path), f"seed {seed}: left behind {left_behind(tmp_path)}"
