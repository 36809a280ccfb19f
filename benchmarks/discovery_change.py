"""Change latency of the host cache: a check turns critical in Consul -> the cache file drops the host.

A stand-in job (this process, ``HVD_ELASTIC_DISCOVERY_CACHE=on``) makes its
first discovery call, which starts the watcher; then, ``--changes`` times, a
different instance's TTL check is failed through its node's agent
(``PUT /v1/agent/check/fail/...``) and the clock runs until the cache file no
longer lists that instance's host (the file is re-read whenever its mtime
moves, polled every 2 ms).  The check is then passed again and the time until
the host is listed again is the join latency.  After each leave one real
discovery call checks that its output dropped the host too (not timed).

Every discovery call horovodrun makes after a change reads that file, so the
leave latency is how long after Consul learned of a failure discovery still
listed the host (plus up to horovodrun's 1 s polling interval).

``--parked N`` adds N other watchers of the same query (other jobs'), each a
thread that re-parks its blocking query after every answer, so the agent
answers N + 1 watchers per change, as it must with many jobs.

    python benchmarks/discovery_change.py [--instances 1000] [--changes 20] [--json PATH]
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: testbed/ is not installed
sys.path.insert(0, str(Path(__file__).resolve().parent))

from testbed.hostcache import cache_files, fresh_record, kill_watchers, read_record  # noqa: E402
from discovery_speed import (ARGS, CONSUL_HOSTS, SERVICE, child_env, cluster_parser, dev_agent,  # noqa: E402
                             private_dir, request, result_path)
from report import Row, format_table, load_note, spread, write_json  # noqa: E402

POLL_S = 0.002
GIVE_UP_S = 60.0


def host_of(i: int) -> bytes:
    return f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:8\n".encode()


def wait_for_file(path: Path, listed: bytes, present: bool, start: float) -> float:
    """Seconds from ``start`` until the file's host list has (or lacks) ``listed``."""
    last = None
    while True:
        try:
            stamp = path.stat().st_mtime_ns
        except FileNotFoundError:
            stamp = None
        if stamp != last:
            last = stamp
            rec = read_record(path)
            if rec is not None and not rec.error and (listed in rec.hosts) == present:
                return time.perf_counter() - start
        if time.perf_counter() - start > GIVE_UP_S:
            raise RuntimeError(f"the cache never {'listed' if present else 'dropped'} {listed!r}")
        time.sleep(POLL_S)


def park(addr: str, stop: threading.Event) -> None:
    """Another job's watcher: blocking reads of the health query until ``stop``."""
    index = 0
    while not stop.is_set():
        host, port = addr.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        try:
            conn.request("GET", f"/v1/health/service/{SERVICE}?passing=1&index={index}&wait=60s")
            response = conn.getresponse()
            response.read()
            index = int(response.headers.get("X-Consul-Index", "0"))
        except (OSError, http.client.HTTPException, ValueError):
            time.sleep(0.5)
        finally:
            conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = cluster_parser(__doc__, "discovery_change")
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--parked", type=int, default=0, help="other watchers of the same query parked on the agent")
    args = parser.parse_args(argv)
    if min(args.instances, args.nodes) < 1 or not 1 <= args.changes <= args.instances:
        parser.error("--instances and --nodes must be >= 1, 1 <= --changes <= --instances")

    load = os.getloadavg()
    leave, join = [], []
    with tempfile.TemporaryDirectory(prefix="discovery-change-") as tmp:
        work = Path(tmp)
        state = private_dir(work, "state")
        try:
            with dev_agent(work, args.nodes, args.instances) as addresses:
                nodes = list(addresses.values())
                env = child_env(nodes[0], state, "on")
                first = subprocess.run([str(CONSUL_HOSTS), *ARGS], env=env, capture_output=True, start_new_session=True,
                                       timeout=120)
                assert first.returncode == 0, first.stderr[-500:]
                deadline = time.monotonic() + 120
                while fresh_record(state) is None:
                    assert time.monotonic() < deadline, "the watcher never answered"
                    time.sleep(0.05)
                path = cache_files(state)[0]
                stop = threading.Event()
                parked = [threading.Thread(target=park, args=(nodes[k % len(nodes)], stop), daemon=True)
                          for k in range(args.parked)]
                for thread in parked:
                    thread.start()
                step = max(args.instances // args.changes, 1)
                for n in range(args.changes):
                    i = n * step
                    check = f"/v1/agent/check/%s/service:{SERVICE}-{i}"
                    agent_addr = nodes[i % len(nodes)]
                    start = time.perf_counter()
                    status, _ = request(agent_addr, "PUT", check % "fail")
                    assert status == 200
                    leave.append(wait_for_file(path, host_of(i), False, start))
                    out = subprocess.run([str(CONSUL_HOSTS), *ARGS], env=env, capture_output=True,
                                         start_new_session=True, timeout=120)
                    assert (out.returncode == 0
                            and host_of(i) not in out.stdout), "discovery still printed the failed host"
                    start = time.perf_counter()
                    status, _ = request(agent_addr, "PUT", check % "pass")
                    assert status == 200
                    join.append(wait_for_file(path, host_of(i), True, start))
                size = len(request(nodes[0], "GET", f"/v1/health/service/{SERVICE}?passing=1")[1])
                stop.set()
        finally:
            kill_watchers(state)

    rows = [Row("check critical -> host gone from the cache file", spread(leave)),
            Row("check passing -> host back in the cache file", spread(join))]
    print(format_table(f"host cache change latency, {args.instances} instances ({size / 1e6:.2f} MB answer), "
                       f"{args.changes} changes, {args.parked} other watchers parked; {load_note(load)}", rows))
    write_json(result_path(args, "discovery_change"),
               {"instances": args.instances, "changes": args.changes, "parked": args.parked, "answer_bytes": size,
                "rows": rows, "leave_s": leave, "join_s": join})
    return 0


if __name__ == "__main__":
    sys.exit(main())
