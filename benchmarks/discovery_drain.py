"""Seconds from a node leaving to the first training step at the new world size.

Two elastic horovodrun jobs (Gloo, hosts ``localhost`` and ``127.0.0.1``, one
slot each, the tiny allreduce worker of the end-to-end test), run one after
the other in the same process:

* consul    -- hosts come from ``discovery/consul_hosts`` against the dev Consul
               agent fed by two node agents; the clock starts when
               ``hvd-elastic drain`` is launched for 127.0.0.1 (its own start-up
               included) and stops at rank 0's first step in a world of one;
* host file -- Horovod's plain way: a discovery script that ``cat``s a host
               file; the clock starts when 127.0.0.1 is deleted from the file.

Each round then brings the node back (undrain / rewrite the file) and waits
for a world of two before the next round.  Reported: median, min and max over
``--rounds`` per mode and the ratio consul / host file.  Upstream Horovod with
a plain host file measured 1.4 s on this machine kind.

    python benchmarks/discovery_drain.py [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "nodeagent"))  # the worker and its log reader

from discovery_speed import start_agent  # noqa: E402  (this folder)
from sizes_log import SizesLog  # noqa: E402

VENV_BIN = Path(sys.executable).parent
WORKER = REPO / "tests" / "nodeagent" / "worker_sizes.py"
CONSUL_HOSTS = REPO / "discovery" / "consul_hosts"


def base_env(workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONSUL_", "HVD_ELASTIC_"))}
    env.update(PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1",
               HVD_ELASTIC_DISCOVERY_STATE_DIR=str(workdir / "state"))
    return env


def start_job(workdir: Path, env: dict[str, str], discovery: str) -> subprocess.Popen:
    job_env = dict(env, SIZES_DIR=str(workdir), HOROVOD_GLOO_TIMEOUT_SECONDS="30", HOROVOD_ELASTIC_TIMEOUT="120", STEP_SLEEP="0.02")
    return subprocess.Popen(
        [str(VENV_BIN / "horovodrun"), "-np", "2", "--min-np", "1", "--max-np", "2",
         "--host-discovery-script", discovery, sys.executable, str(WORKER)],
        env=job_env, stdout=open(workdir / "horovodrun.log", "w"), stderr=subprocess.STDOUT, start_new_session=True,
    )


def stop_job(job: subprocess.Popen, workdir: Path) -> None:
    (workdir / "stop").touch()
    try:
        job.wait(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


def rounds(job: subprocess.Popen, workdir: Path, n: int, leave, rejoin) -> tuple[list[float], list[float]]:
    """(leave() -> first step at size 1, leave()'s own duration), ``n`` times; ``rejoin()`` in between."""
    sizes = SizesLog(workdir)
    sizes.wait_for_size(2, job, timeout=180)
    times, leave_times = [], []
    for _ in range(n):
        time.sleep(1.0)  # a steady world of two
        start = time.time()
        leave()
        leave_times.append(time.time() - start)
        times.append(sizes.wait_for_size(1, job, timeout=120, since=start) - start)
        rejoined = time.time()
        rejoin()
        sizes.wait_for_size(2, job, timeout=180, since=rejoined)
    return times, leave_times


def consul_mode(n: int, workdir: Path) -> tuple[list[float], list[float]]:
    env = base_env(workdir)
    # The dev agent runs in its own process, as Consul would: not competing with this one.
    consul, addresses = start_agent(["localhost", "127.0.0.1"], workdir)
    local, other = addresses["localhost"], addresses["127.0.0.1"]
    agents = [
        subprocess.Popen([str(VENV_BIN / "hvd-elastic"), "--log-level", "WARNING", "node-agent", "--slots", "1",
                          "--ttl", "3", "--interval", "0.5", "--probe", "memory", "--min-free-memory", "1K", "--http-addr", addr],
                         env=env, start_new_session=True)
        for addr in (local, other)
    ]
    job = start_job(workdir, env, f"{CONSUL_HOSTS} --http-addr {local}")

    def hvd(*args: str) -> None:
        subprocess.run([str(VENV_BIN / "hvd-elastic"), *args, "--http-addr", other], env=env, check=True, capture_output=True, timeout=60)

    try:
        return rounds(job, workdir, n, lambda: hvd("drain", "--reason", "benchmark"), lambda: hvd("undrain"))
    finally:
        stop_job(job, workdir)
        for proc in (*agents, consul):
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)


def hostfile_mode(n: int, workdir: Path) -> tuple[list[float], list[float]]:
    hosts = workdir / "hosts"
    hosts.write_text("localhost:1\n127.0.0.1:1\n")
    script = workdir / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    job = start_job(workdir, base_env(workdir), str(script))
    try:
        return rounds(job, workdir, n, lambda: hosts.write_text("localhost:1\n"), lambda: hosts.write_text("localhost:1\n127.0.0.1:1\n"))
    finally:
        stop_job(job, workdir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "discovery_drain.json"))
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")

    results = {}
    for name, mode in (("consul", consul_mode), ("host file", hostfile_mode)):
        with tempfile.TemporaryDirectory() as tmp:
            times, leave_times = mode(args.rounds, Path(tmp))
        results[name] = {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "rounds_s": times,
                         "leave_command_median_s": statistics.median(leave_times)}

    ratio = results["consul"]["median_s"] / results["host file"]["median_s"]
    print(f"node leaves -> first training step at the new size ({args.rounds} rounds each)")
    print(f"{'mode':<12}{'median s':>10}{'min s':>8}{'max s':>8}{'of which the leave command s':>30}")
    for name, r in results.items():
        print(f"{name:<12}{r['median_s']:>10.2f}{r['min_s']:>8.2f}{r['max_s']:>8.2f}{r['leave_command_median_s']:>30.2f}")
    print(f"consul / host file = {ratio:.2f} (upstream Horovod with a host file: 1.4 s measured here)")
    out = {"rounds": args.rounds, "modes": results, "ratio_consul_vs_hostfile": ratio}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
