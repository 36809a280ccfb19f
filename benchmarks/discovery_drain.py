"""Seconds from a node leaving to the first training step at the new world size.

Two ways of telling elastic horovodrun (Gloo, hosts ``localhost`` and
``127.0.0.1``, one slot each, the tiny allreduce worker of the end-to-end test,
``tests/nodeagent/worker_sizes.py``) that a node left:

* consul    -- hosts come from ``discovery/consul_hosts`` against the dev Consul
               agent fed by two node agents; the clock starts when
               ``hvd-elastic drain`` is launched for 127.0.0.1 (its own start-up
               included) and stops at rank 0's first step in a world of one;
* host file -- the baseline, Horovod's plain way: a discovery script that
               ``cat``s a host file; the clock starts when 127.0.0.1 is deleted
               from the file.

The modes take turns round by round (the machine is noisy: interleaved, both
see the same drift), and which goes first alternates.  A round of a mode starts
a fresh job, waits for a world of two and one steady second, makes the node
leave, times it, and stops the job; the node then comes back (undrain / a new
host file).  The dev agent and both node agents run through the whole
benchmark, so both modes train next to the same background.  Reported: median,
min and max over ``--rounds`` per mode with the number of samples, and the
ratio consul / host file with its baseline named.  Upstream Horovod with a
plain host file measured 1.4 s on this machine kind.

    python benchmarks/discovery_drain.py [--rounds 3] [--json PATH]

Everything runs in one temporary directory, removed at the end (also on failure).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: testbed/ is not installed
from testbed import (CONSUL_HOSTS, HVD_ELASTIC, REPO, Job, WorldSizes, child_env, horovodrun_elastic,  # noqa: E402
                     host_file_discovery, start_dev_agent, start_node_agent, wait_until)
from testbed.consul import run_discovery  # noqa: E402

WORKER = REPO / "tests" / "nodeagent" / "worker_sizes.py"
BOTH = "localhost:1\n127.0.0.1:1\n"
BASELINE = "host file"


def time_a_leave(workdir: Path, env: dict[str, str], discovery: str, leave: Callable[[], None]) -> tuple[float, float]:
    """(leave() -> rank 0's first step at size 1, leave()'s own duration) in a fresh job of two, then stop it."""
    workdir.mkdir(exist_ok=True)
    job_env = dict(env, SIZES_DIR=str(workdir), HOROVOD_GLOO_TIMEOUT_SECONDS="30", HOROVOD_ELASTIC_TIMEOUT="120",
                   STEP_SLEEP="0.02")
    cmd = [*horovodrun_elastic(discovery, 2, 1, 2), sys.executable, WORKER]
    sizes = WorldSizes(workdir / "sizes.*.jsonl")
    with Job(cmd, env=job_env, logdir=workdir, name="horovodrun") as job:
        job.start()
        sizes.wait_for_size(job, 2, timeout=180)
        time.sleep(1.0)  # a steady world of two
        start = time.time()
        leave()
        leave_s = time.time() - start
        seconds = sizes.wait_for_size(job, 1, timeout=120, since=start) - start
        (workdir / "stop").touch()
        job.finish(timeout=120)
    return seconds, leave_s


class ConsulMode:
    """The dev agent and a node agent per host; a leave is ``hvd-elastic drain`` on 127.0.0.1."""

    def __init__(self, workdir: Path, cleanup: contextlib.ExitStack):
        self.env = child_env(discovery_state=workdir / "discovery-state")
        # The dev agent runs in its own process, as Consul would: not competing with this one.
        consul, addresses = start_dev_agent(["localhost", "127.0.0.1"], env=self.env, logdir=workdir)
        cleanup.enter_context(consul)
        self.local, self.other = addresses["localhost"], addresses["127.0.0.1"]
        self.agents = [
            cleanup.enter_context(start_node_agent(
                "--slots", "1", "--ttl", "3", "--interval", "0.5", "--probe", "memory", "--min-free-memory", "1K",
                "--http-addr", addr, env=self.env, logdir=workdir, name=f"node-agent.{host}", log_level="WARNING"))
            for host, addr in addresses.items()
        ]
        self.wait_for_both()

    def hvd(self, *args: str) -> None:
        subprocess.run([HVD_ELASTIC, *args, "--http-addr", self.other], env=self.env, check=True, capture_output=True,
                       timeout=60)

    def wait_for_both(self) -> None:
        wait_until("discovery to list both hosts",
                   lambda: (sorted(run_discovery(self.env, "--http-addr", self.local).stdout.split())
                            == sorted(BOTH.split())),
                   timeout=60, interval=0.2, jobs=self.agents)

    def round(self, workdir: Path) -> tuple[float, float]:
        result = time_a_leave(workdir, self.env, f"{CONSUL_HOSTS} --http-addr {self.local}",
                              lambda: self.hvd("drain", "--reason", "benchmark"))
        self.hvd("undrain")
        self.wait_for_both()
        return result


class HostFileMode:
    """A host file per round; a leave rewrites it without 127.0.0.1."""

    def __init__(self, workdir: Path):
        self.env = child_env(discovery_state=workdir / "discovery-state")

    def round(self, workdir: Path) -> tuple[float, float]:
        workdir.mkdir()
        hosts = workdir / "hosts"
        script = host_file_discovery(hosts, BOTH)
        return time_a_leave(workdir, self.env, str(script), lambda: hosts.write_text("localhost:1\n"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "discovery_drain.json"))
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")

    samples: dict[str, list[tuple[float, float]]] = {"consul": [], BASELINE: []}
    with tempfile.TemporaryDirectory(prefix="discovery_drain.") as tmp, contextlib.ExitStack() as cleanup:
        workdir = Path(tmp)
        modes = {"consul": ConsulMode(workdir, cleanup), BASELINE: HostFileMode(workdir)}
        for r in range(args.rounds):
            order = list(modes) if r % 2 == 0 else list(reversed(modes))
            for name in order:
                samples[name].append(modes[name].round(workdir / f"{name.replace(' ', '-')}.{r}"))

    results = {}
    for name, rows in samples.items():
        times = [t for t, _ in rows]
        results[name] = {"samples": len(times), "median_s": statistics.median(times), "min_s": min(times),
                         "max_s": max(times), "rounds_s": times,
                         "leave_command_median_s": statistics.median(leave for _, leave in rows)}
    ratio = results["consul"]["median_s"] / results[BASELINE]["median_s"]
    print("node leaves -> first training step at the new size (modes interleaved round by round)")
    print(f"{'mode':<12}{'n':>4}{'median s':>10}{'min s':>8}{'max s':>8}{'of which the leave command s':>30}")
    for name, r in results.items():
        print(f"{name:<12}{r['samples']:>4}{r['median_s']:>10.2f}{r['min_s']:>8.2f}{r['max_s']:>8.2f}"
              f"{r['leave_command_median_s']:>30.2f}")
    print(f"consul / {BASELINE} = {ratio:.2f}  (baseline: {BASELINE}; medians of {results['consul']['samples']} and "
          f"{results[BASELINE]['samples']} samples; upstream Horovod with a host file: 1.4 s measured here)")
    out = {"rounds": args.rounds, "interleaved": True, "baseline": BASELINE, "modes": results,
           "ratio_consul_vs_hostfile": ratio}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
