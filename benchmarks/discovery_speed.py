"""How long one host-discovery call takes against 1,000 healthy instances.

horovodrun runs its ``--host-discovery-script`` every second, and once more
on every reset, while holding a lock: the call's wall time is dead time for the
driver.  Target: the median wall time of one ``discovery/consul_hosts``
invocation is at most 5x that of ``python3 -c pass`` measured in the same run
(both with the same ``python3`` from PATH, runs interleaved).

The Consul dev agent runs as its own process (``hvd-elastic consul-dev``) with
``--instances`` passing instances spread over ``--nodes`` nodes, each instance
with its own service address, and discovery runs with
``--host-name service-address`` so it validates and prints one line per
instance (the heaviest case).  Also reported: ``hvd-elastic discover`` (the
same logic behind the lead's CLI entry point) and the agent's own answer time
for the health query, measured in-process, which is part of every call.

    python benchmarks/discovery_speed.py [--instances 1000] [--runs 30] [--json PATH]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
CONSUL_HOSTS = REPO / "discovery" / "consul_hosts"
SERVICE = "horovod"


def start_agent(nodes: list[str], workdir: Path) -> tuple[subprocess.Popen, dict[str, str]]:
    """``hvd-elastic consul-dev`` for ``nodes`` in its own process; returns it and {node: addr}."""
    ready = workdir / "ready.json"
    names = ",".join(nodes)
    proc = subprocess.Popen(
        [str(VENV_BIN / "hvd-elastic"), "--log-level", "WARNING", "consul-dev", "--nodes", names, "--http-port", "0", "--ready-file", str(ready)],
        stdout=subprocess.DEVNULL, start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not ready.exists() or not ready.read_text().strip():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("consul-dev did not start")
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())


def request(addr: str, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def register(addresses: dict[str, str], instances: int) -> None:
    nodes = list(addresses.values())
    for i in range(instances):
        body = json.dumps({
            "Name": SERVICE, "ID": f"{SERVICE}-{i}", "Address": f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
            "Meta": {"slots": "8", "gpu_model": "NVIDIA H100 80GB HBM3"}, "Tags": ["gpu"],
            "Check": {"TTL": "3600s", "Status": "passing"},
        }).encode()
        status, answer = request(nodes[i % len(nodes)], "PUT", "/v1/agent/service/register", body)
        assert status == 200, answer


def wall(cmd: list[str], env: dict[str, str]) -> tuple[float, float, subprocess.CompletedProcess]:
    """(wall seconds, CPU seconds of the child, result) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, start_new_session=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), result


def measure(args: argparse.Namespace, addr: str, workdir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONSUL_", "HVD_ELASTIC_", "PYTHON"))}
    env.update(PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", CONSUL_HTTP_ADDR=addr,
               HVD_ELASTIC_DISCOVERY_STATE_DIR=str(workdir / "state"))
    commands = {
        "python3 -c pass": ["python3", "-c", "pass"],
        "discovery/consul_hosts": [str(CONSUL_HOSTS), "--host-name", "service-address"],
        "hvd-elastic discover": [str(VENV_BIN / "hvd-elastic"), "discover", "--host-name", "service-address"],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    for name, cmd in commands.items():  # warm the page cache; check the output once
        _, _, result = wall(cmd, env)
        if name != "python3 -c pass":
            lines = result.stdout.splitlines()
            assert result.returncode == 0 and len(lines) == args.instances, (result.returncode, len(lines), result.stderr[-500:])
    for _ in range(args.runs):  # interleaved, so load changes hit every command alike
        for name, cmd in commands.items():
            elapsed, cpu_s, result = wall(cmd, env)
            assert result.returncode == 0, result.stderr
            times[name].append(elapsed)
            cpu[name].append(cpu_s)

    agent_times, size = [], 0
    for _ in range(args.runs):
        start = time.perf_counter()
        status, body = request(addr, "GET", f"/v1/health/service/{SERVICE}?passing=1")
        agent_times.append(time.perf_counter() - start)
        assert status == 200
        size = len(body)

    medians = {name: statistics.median(values) for name, values in times.items()}
    baseline = medians["python3 -c pass"]
    return {
        "instances": args.instances,
        "nodes": args.nodes,
        "runs": args.runs,
        "health_response_bytes": size,
        "median_s": medians,
        "p90_s": {name: statistics.quantiles(values, n=10)[-1] for name, values in times.items()},
        # CPU time of the child alone: less sensitive to other load on the machine than wall time.
        "cpu_median_s": {name: statistics.median(values) for name, values in cpu.items()},
        "agent_answer_median_s": statistics.median(agent_times),
        "ratio_consul_hosts_vs_python_pass": medians["discovery/consul_hosts"] / baseline,
        "ratio_hvd_elastic_discover_vs_python_pass": medians["hvd-elastic discover"] / baseline,
        "target_ratio": 5.0,
        "meets_target": medians["discovery/consul_hosts"] / baseline <= 5.0,
        "python3": subprocess.run(["python3", "-c", "import sys; print(sys.executable)"], env=env, capture_output=True, text=True).stdout.strip(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=4, help="dev-agent nodes the instances are spread over")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "discovery_speed.json"))
    args = parser.parse_args(argv)
    if min(args.instances, args.nodes, args.runs) < 1 or args.instances > 65536 * 256:
        parser.error("--instances, --nodes and --runs must be >= 1")

    with tempfile.TemporaryDirectory() as tmp:
        proc, addresses = start_agent([f"node{i}" for i in range(args.nodes)], Path(tmp))
        try:
            register(addresses, args.instances)
            result = measure(args, next(iter(addresses.values())), Path(tmp))
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)

    print(f"discovery against {result['instances']} healthy instances ({result['health_response_bytes'] / 1e6:.2f} MB answer), {result['runs']} runs each")
    print(f"{'command':<28}{'median ms':>11}{'p90 ms':>9}{'x python3 -c pass':>19}{'CPU ms':>8}{'CPU x':>7}")
    base = result["median_s"]["python3 -c pass"]
    cpu_base = result["cpu_median_s"]["python3 -c pass"]
    for name, median in result["median_s"].items():
        cpu_ms = result["cpu_median_s"][name]
        print(f"{name:<28}{median * 1e3:>11.1f}{result['p90_s'][name] * 1e3:>9.1f}{median / base:>19.2f}{cpu_ms * 1e3:>8.1f}{cpu_ms / cpu_base:>7.2f}")
    print(f"{'(agent answer, in-process)':<28}{result['agent_answer_median_s'] * 1e3:>11.1f}")
    verdict = "meets" if result["meets_target"] else "MISSES"
    print(f"consul_hosts / python3 -c pass = {result['ratio_consul_hosts_vs_python_pass']:.2f} ({verdict} the <= 5x target)")

    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
