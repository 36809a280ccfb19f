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

    python benchmarks/discovery_change.py [--instances 1000] [--changes 20] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "discovery"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cache_testing import DevAgentProcess, cache_files, fresh_record, kill_watchers, read_record  # noqa: E402
from discovery_speed import ARGS, CONSUL_HOSTS, SERVICE, child_env, private_dir, register, request  # noqa: E402
from report import RESULTS, Row, format_table, load_note, spread, write_json  # noqa: E402

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--json", default=None, help="default benchmarks/results/discovery_change_<instances>.json")
    args = parser.parse_args(argv)
    if min(args.instances, args.nodes) < 1 or not 1 <= args.changes <= args.instances:
        parser.error("--instances and --nodes must be >= 1, 1 <= --changes <= --instances")

    load = os.getloadavg()
    leave, join = [], []
    with tempfile.TemporaryDirectory(prefix="discovery-change-") as tmp:
        work = Path(tmp)
        state = private_dir(work, "state")
        try:
            with DevAgentProcess(work, [f"node{i}" for i in range(args.nodes)]) as agent:
                register(agent.addresses, args.instances)
                nodes = list(agent.addresses.values())
                env = child_env(nodes[0], state, "on")
                first = subprocess.run([str(CONSUL_HOSTS), *ARGS], env=env, capture_output=True, start_new_session=True, timeout=120)
                assert first.returncode == 0, first.stderr[-500:]
                deadline = time.monotonic() + 120
                while fresh_record(state) is None:
                    assert time.monotonic() < deadline, "the watcher never answered"
                    time.sleep(0.05)
                path = cache_files(state)[0]
                step = max(args.instances // args.changes, 1)
                for n in range(args.changes):
                    i = n * step
                    check = f"/v1/agent/check/%s/service:{SERVICE}-{i}"
                    agent_addr = nodes[i % len(nodes)]
                    start = time.perf_counter()
                    status, _ = request(agent_addr, "PUT", check % "fail")
                    assert status == 200
                    leave.append(wait_for_file(path, host_of(i), False, start))
                    out = subprocess.run([str(CONSUL_HOSTS), *ARGS], env=env, capture_output=True, start_new_session=True, timeout=120)
                    assert out.returncode == 0 and host_of(i) not in out.stdout, "discovery still printed the failed host"
                    start = time.perf_counter()
                    status, _ = request(agent_addr, "PUT", check % "pass")
                    assert status == 200
                    join.append(wait_for_file(path, host_of(i), True, start))
                size = len(request(nodes[0], "GET", f"/v1/health/service/{SERVICE}?passing=1")[1])
        finally:
            kill_watchers(state)

    rows = [Row("check critical -> host gone from the cache file", spread(leave)),
            Row("check passing -> host back in the cache file", spread(join))]
    print(format_table(f"host cache change latency, {args.instances} instances ({size / 1e6:.2f} MB answer), "
                       f"{args.changes} changes; {load_note(load)}", rows))
    path = Path(args.json) if args.json else RESULTS / f"discovery_change_{args.instances}.json"
    write_json(path, {"instances": args.instances, "changes": args.changes, "answer_bytes": size, "rows": rows,
                      "leave_s": leave, "join_s": join})
    return 0


if __name__ == "__main__":
    sys.exit(main())
