"""How much discovery traffic the Consul dev agent sustains with 1,000 registered instances.

The agent runs as its own process (``hvd-elastic consul-dev``); this process is
the load.  Measured in one run:

* health reads/s  -- ``GET /v1/health/service/<svc>?passing`` (1,000 entries) from
                     ``--readers`` keep-alive connections, first with no watcher
                     parked (the baseline), then with ``--watchers`` blocking
                     queries parked on the same service; the ratio shows what the
                     parked watchers cost;
* wake-up         -- one instance's TTL check fails: seconds until every parked
                     watcher has its answer (p50 / p99 / max over ``--rounds``);
* TTL updates/s   -- ``PUT /v1/agent/check/pass/<id>`` heartbeats, the steady
                     write load of node agents;
* agent RSS       -- resident memory of the agent process with the watchers parked.

horovodrun's discovery path reads the service about once a second per job, so
reads/s is the number of jobs (or watchers) one dev agent can serve.

    python benchmarks/devagent_load.py [--instances 1000] [--watchers 1000] [--readers 8]
                                       [--seconds 5] [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

SERVICE = "bench-train"


class Conn:
    """One keep-alive HTTP/1.1 connection; just enough client for this benchmark."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=2**20)
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Length: {len(body)}\r\n\r\n"
        self.writer.write(head.encode() + body)
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        headers = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        data = await self.reader.readexactly(int(headers.get("content-length", "0")))
        return status, headers, data

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def start_agent(nodes: int) -> tuple[subprocess.Popen, dict[str, str]]:
    ready = Path(tempfile.mkdtemp()) / "ready.json"
    names = ",".join(f"node-{i}" for i in range(nodes))
    proc = subprocess.Popen(
        [sys.executable, "-m", "hvd_elastic.cli", "--log-level", "WARNING", "consul-dev", "--nodes", names,
         "--http-port", "0", "--ready-file", str(ready)],
        stdout=subprocess.DEVNULL, start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("consul-dev did not start")
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())


async def register(addresses: dict[str, str], instances: int) -> list[tuple[str, str]]:
    """Spread ``instances`` TTL-checked instances over the nodes; all passing."""
    conns = {n: Conn(*a.rsplit(":", 1)) for n, a in addresses.items()}
    nodes = list(addresses)
    placed = []
    for i in range(instances):
        node = nodes[i % len(nodes)]
        sid = f"{SERVICE}-{i}"
        body = json.dumps({"Name": SERVICE, "ID": sid, "Port": 20000 + i, "Meta": {"slots": "8"},
                           "Check": {"TTL": "600s", "Status": "passing"}}).encode()
        status, _, _ = await conns[node].request("PUT", "/v1/agent/service/register", body)
        assert status == 200
        placed.append((node, sid))
    for conn in conns.values():
        conn.close()
    return placed


async def read_rate(addr: str, readers: int, seconds: float) -> tuple[float, int, int]:
    """(reads/s, entries in the last answer, its size in bytes)."""
    host, port = addr.rsplit(":", 1)
    count = 0
    entries = size = 0
    stop_at = time.monotonic() + seconds

    async def loop():
        nonlocal count, entries, size
        conn = Conn(host, int(port))
        while time.monotonic() < stop_at:
            status, _, data = await conn.request("GET", f"/v1/health/service/{SERVICE}?passing")
            assert status == 200
            count += 1
            entries, size = data.count(b'"Service":{'), len(data)
        conn.close()

    started = time.monotonic()
    await asyncio.gather(*(loop() for _ in range(readers)))
    return count / (time.monotonic() - started), entries, size


async def park_watchers(addresses: dict[str, str], watchers: int, index: str) -> list[asyncio.Task]:
    addrs = list(addresses.values())
    conns = [Conn(*addrs[i % len(addrs)].rsplit(":", 1)) for i in range(watchers)]

    async def watch(conn: Conn) -> float:
        status, headers, _ = await conn.request("GET", f"/v1/health/service/{SERVICE}?passing&index={index}&wait=120s")
        assert status == 200
        conn.close()
        return time.monotonic()

    return [asyncio.get_running_loop().create_task(watch(c)) for c in conns]


async def current_index(addr: str) -> str:
    conn = Conn(*addr.rsplit(":", 1))
    _, headers, _ = await conn.request("GET", f"/v1/health/service/{SERVICE}?passing")
    conn.close()
    return headers["x-consul-index"]


async def ttl_rate(addresses: dict[str, str], placed: list[tuple[str, str]], seconds: float) -> float:
    conns = {n: Conn(*a.rsplit(":", 1)) for n, a in addresses.items()}
    count = 0
    stop_at = time.monotonic() + seconds

    async def loop(node: str):
        nonlocal count
        mine = [sid for n, sid in placed if n == node]
        i = 0
        while time.monotonic() < stop_at:
            status, _, _ = await conns[node].request("PUT", f"/v1/agent/check/pass/service:{mine[i % len(mine)]}")
            assert status == 200
            count += 1
            i += 1

    started = time.monotonic()
    await asyncio.gather(*(loop(n) for n in addresses))
    for conn in conns.values():
        conn.close()
    return count / (time.monotonic() - started)


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


async def measure(args, addresses: dict[str, str], proc: psutil.Process) -> dict:
    first = next(iter(addresses.values()))
    placed = await register(addresses, args.instances)
    await read_rate(first, args.readers, 1.0)  # warm-up: connections, allocator, response cache
    cpu0, wall0 = cpu_seconds(proc), time.monotonic()
    baseline, entries, size = await read_rate(first, args.readers, args.seconds)
    # Reads the agent could serve per second of its own CPU: the figure that does not
    # depend on how much CPU this load generator and other processes take.
    reads_per_agent_cpu_s = baseline * (time.monotonic() - wall0) / (cpu_seconds(proc) - cpu0)
    assert entries == args.instances, entries

    wakeups, wake_cpu, rss = [], [], 0
    loaded = 0.0
    for round_no in range(args.rounds):
        index = await current_index(first)
        tasks = await park_watchers(addresses, args.watchers, index)
        await asyncio.sleep(1.0)  # let every watcher park
        if round_no == 0:
            loaded, _, _ = await read_rate(first, args.readers, args.seconds)
            rss = proc.memory_info().rss
        node, sid = placed[round_no]
        conn = Conn(*addresses[node].rsplit(":", 1))
        changed, cpu0 = time.monotonic(), cpu_seconds(proc)
        status, _, _ = await conn.request("PUT", f"/v1/agent/check/fail/service:{sid}")
        assert status == 200
        done = await asyncio.gather(*tasks)
        wakeups.append(max(done) - changed)
        wake_cpu.append(cpu_seconds(proc) - cpu0)
        await conn.request("PUT", f"/v1/agent/check/pass/service:{sid}")
        conn.close()
    heartbeats = await ttl_rate(addresses, placed, args.seconds)
    return {
        "instances": args.instances,
        "watchers": args.watchers,
        "readers": args.readers,
        "health_reads_per_s_baseline": baseline,
        "health_reads_per_agent_cpu_s": reads_per_agent_cpu_s,
        "health_response_bytes": size,
        "health_reads_per_s_with_watchers": loaded,
        "reads_ratio_with_watchers_vs_baseline": loaded / baseline,
        "wake_all_watchers_s": {"p50": statistics.median(wakeups), "max": max(wakeups), "rounds": wakeups},
        "wake_all_watchers_agent_cpu_s": statistics.median(wake_cpu),
        "ttl_updates_per_s": heartbeats,
        "agent_rss_mib_with_watchers": rss / 2**20,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--watchers", type=int, default=1000)
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=4, help="simulated nodes the instances are spread over")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each rate measurement")
    parser.add_argument("--rounds", type=int, default=3, help="wake-up measurements")
    parser.add_argument("--json", default=str(Path(__file__).parent / "results" / "devagent_load.json"))
    args = parser.parse_args(argv)
    if min(args.instances, args.watchers, args.readers, args.nodes, args.rounds) < 1 or args.seconds <= 0:
        parser.error("--instances, --watchers, --readers, --nodes, --rounds must be >= 1 and --seconds > 0")

    proc, addresses = start_agent(args.nodes)
    try:
        result = asyncio.run(measure(args, addresses, psutil.Process(proc.pid)))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)

    rows = [
        ("health reads/s, no watchers (baseline)", f"{result['health_reads_per_s_baseline']:.0f}"),
        (f"health reads/s, {args.watchers} watchers parked", f"{result['health_reads_per_s_with_watchers']:.0f}"),
        ("  ratio vs baseline", f"{result['reads_ratio_with_watchers_vs_baseline']:.2f}"),
        ("health reads per agent CPU-second", f"{result['health_reads_per_agent_cpu_s']:.0f}"),
        (f"wake all {args.watchers} watchers, p50 / max (s)",
         f"{result['wake_all_watchers_s']['p50']:.3f} / {result['wake_all_watchers_s']['max']:.3f}"),
        (f"agent CPU to wake all {args.watchers} (s)", f"{result['wake_all_watchers_agent_cpu_s']:.3f}"),
        ("TTL updates/s", f"{result['ttl_updates_per_s']:.0f}"),
        ("agent RSS with watchers (MiB)", f"{result['agent_rss_mib_with_watchers']:.0f}"),
    ]
    print(f"consul-dev load: {args.instances} instances on {args.nodes} nodes, {args.readers} reader connections, "
          f"{result['health_response_bytes'] / 1e6:.1f} MB per health answer")
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value:>12}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
