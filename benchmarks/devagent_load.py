"""How much discovery traffic the Consul dev agent sustains with 1,000 registered instances.

The agent runs as its own process (``hvd-elastic consul-dev``); this process is
the load.  Measured in one run:

* health reads/s  -- ``GET /v1/health/service/<svc>?passing`` (1,000 entries) from
                     ``--readers`` keep-alive connections, with no watcher parked
                     (the baseline) and with ``--watchers`` blocking queries parked
                     on the same service, the two alternating round by round; the
                     ratio, taken per round, shows what the parked watchers cost.
                     Nothing changes between reads, so the agent answers them from
                     its response cache;
* wake-up         -- one instance's TTL check fails: seconds until every parked
                     watcher has its answer (one per round);
* TTL updates/s   -- ``PUT /v1/agent/check/pass/<id>`` heartbeats, the steady
                     write load of node agents;
* agent RSS       -- resident memory of the agent process with the watchers parked.

horovodrun's discovery path reads the service about once a second per job, so
reads/s is the number of jobs (or watchers) one dev agent can serve.

    python benchmarks/devagent_load.py [--instances 1000] [--watchers 1000] [--readers 8]
                                       [--seconds 3] [--rounds 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import RESULTS, Row, format_table, load_note, paired_ratio, spread, write_json  # noqa: E402

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


def start_agent(nodes: int, workdir: Path) -> tuple[subprocess.Popen, dict[str, str]]:
    ready = workdir / "ready.json"
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


async def measure(args, addresses: dict[str, str], proc: psutil.Process) -> dict[str, list[float]]:
    """Per round: reads with no watcher parked (the baseline), reads with ``--watchers``
    parked, then one change that wakes them all, then TTL heartbeats."""
    first = next(iter(addresses.values()))
    placed = await register(addresses, args.instances)
    await read_rate(first, args.readers, 1.0)  # warm-up: connections, allocator, response cache
    s: dict[str, list[float]] = {k: [] for k in ("reads", "reads_watched", "reads_per_agent_cpu_s", "wake_s",
                                                  "wake_agent_cpu_s", "ttl_per_s", "rss_mib", "answer_bytes")}
    for round_no in range(args.rounds):
        # The previous round's watchers were all answered: none is parked now.
        cpu0, wall0 = cpu_seconds(proc), time.monotonic()
        rate, entries, size = await read_rate(first, args.readers, args.seconds)
        assert entries == args.instances, entries
        s["reads"].append(rate)
        # Reads the agent could serve per second of its own CPU: the figure that does not
        # depend on how much CPU this load generator and other processes take.
        s["reads_per_agent_cpu_s"].append(rate * (time.monotonic() - wall0) / (cpu_seconds(proc) - cpu0))
        s["answer_bytes"].append(size)

        index = await current_index(first)
        tasks = await park_watchers(addresses, args.watchers, index)
        await asyncio.sleep(1.0)  # let every watcher park (one that is late answers at once: same outcome)
        s["reads_watched"].append((await read_rate(first, args.readers, args.seconds))[0])
        s["rss_mib"].append(proc.memory_info().rss / 2**20)

        node, sid = placed[round_no % len(placed)]
        conn = Conn(*addresses[node].rsplit(":", 1))
        changed, cpu0 = time.monotonic(), cpu_seconds(proc)
        status, _, _ = await conn.request("PUT", f"/v1/agent/check/fail/service:{sid}")
        assert status == 200
        done = await asyncio.gather(*tasks)
        s["wake_s"].append(max(done) - changed)
        s["wake_agent_cpu_s"].append(cpu_seconds(proc) - cpu0)
        await conn.request("PUT", f"/v1/agent/check/pass/service:{sid}")
        conn.close()
        s["ttl_per_s"].append(await ttl_rate(addresses, placed, args.seconds))
    return s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--watchers", type=int, default=1000)
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=4, help="simulated nodes the instances are spread over")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each rate measurement")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--json", type=Path, default=RESULTS / "devagent_load.json")
    args = parser.parse_args(argv)
    if min(args.instances, args.watchers, args.readers, args.nodes, args.rounds) < 1 or args.seconds <= 0:
        parser.error("--instances, --watchers, --readers, --nodes, --rounds must be >= 1 and --seconds > 0")

    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="hvd-elastic-devagent-load.") as workdir:
        proc, addresses = start_agent(args.nodes, Path(workdir))
        try:
            s = asyncio.run(measure(args, addresses, psutil.Process(proc.pid)))
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)

    w = args.watchers
    rows = [
        Row("health reads, no watchers (baseline)", spread(s["reads"]), unit="/s"),
        Row(f"health reads, {w} watchers parked", spread(s["reads_watched"]), unit="/s",
            baseline="no watchers", ratio=paired_ratio(s["reads_watched"], s["reads"])),
        Row("health reads per agent CPU-second", spread(s["reads_per_agent_cpu_s"]), unit="/s"),
        Row(f"wake all {w} watchers", spread(s["wake_s"])),
        Row(f"agent CPU to wake all {w}", spread(s["wake_agent_cpu_s"])),
        Row("TTL updates", spread(s["ttl_per_s"]), unit="/s"),
        Row(f"agent RSS with {w} watchers", spread(s["rss_mib"]), unit="MiB"),
    ]
    print(format_table(
        f"consul-dev load: {args.instances} instances on {args.nodes} nodes, {args.readers} reader connections, "
        f"{s['answer_bytes'][-1] / 1e6:.1f} MB per health answer, served from the agent's response cache "
        f"(nothing changes between reads); {args.rounds} interleaved rounds of {args.seconds:g} s rates; "
        f"{load_note(load_at_start)}", rows))
    report = {"instances": args.instances, "watchers": w, "readers": args.readers, "nodes": args.nodes,
              "rows": rows, "samples": s, "load_average_start": load_at_start}
    print(f"wrote {write_json(args.json, report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
