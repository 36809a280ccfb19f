"""Consul load of one job's discovery over a window with nothing changing: host cache against direct queries.

Two stand-in jobs poll at the same time, as horovodrun does (a call, then
1 s of sleep), for ``--seconds``: one with ``--cache off`` (every call a full
``GET /v1/health/service/horovod?passing``), one with the host cache (its first
call queries directly and starts the watcher, whose plain read and parked
blocking query are all Consul sees afterwards).  Each talks to the dev agent
through its own counting proxy on loopback, which records every request and
the bytes sent back, so the figures are what a Consul server would serve.

Reported per job: discovery calls made (and failed), full health answers
served (a blocking query still parked at the end of the window served none),
of those blocking reads, and bytes sent.  The first call of the cache job is
inside the window, so its count includes the job's start.

    python benchmarks/discovery_load.py [--instances 1000] [--seconds 60] [--json PATH]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: testbed/ is not installed
sys.path.insert(0, str(Path(__file__).resolve().parent))

from testbed.hostcache import CountingProxy, kill_watchers  # noqa: E402
from discovery_speed import ARGS, CONSUL_HOSTS, child_env, cluster_parser, dev_agent, private_dir, result_path  # noqa: E402
from report import load_note, write_json  # noqa: E402


def poll(env: dict[str, str], seconds: float, out: dict) -> None:
    """horovodrun's loop: a discovery call, then 1 s of sleep, until ``seconds`` have passed."""
    end = time.monotonic() + seconds
    calls = failures = 0
    while time.monotonic() < end:
        result = subprocess.run([str(CONSUL_HOSTS), *ARGS], env=env, capture_output=True, text=True,
                                start_new_session=True, timeout=60)
        calls += 1
        failures += result.returncode != 0
        time.sleep(1.0)
    out.update(calls=calls, failures=failures)


def summary(proxy: CountingProxy, calls: dict) -> dict:
    served = [r for r in proxy.health() if r[1] > 0]
    return {**calls, "health_answers": len(served), "blocking_answers": sum("index=" in r[0] for r in served),
            "parked_at_end": sum(r[1] == 0 for r in proxy.health()), "bytes_sent": sum(r[1] for r in served)}


def main(argv: list[str] | None = None) -> int:
    parser = cluster_parser(__doc__, "discovery_load")
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args(argv)
    if min(args.instances, args.nodes) < 1 or args.seconds <= 0:
        parser.error("--instances and --nodes must be >= 1, --seconds > 0")

    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="discovery-load-") as tmp:
        work = Path(tmp)
        cache_state = private_dir(work, "cache")
        try:
            with dev_agent(work, args.nodes, args.instances) as addresses:
                addr = next(iter(addresses.values()))
                with CountingProxy(addr) as direct_proxy, CountingProxy(addr) as cache_proxy:
                    calls = {"direct": {}, "cache": {}}
                    loops = [
                        threading.Thread(target=poll,
                                         args=(child_env(direct_proxy.addr, private_dir(work, "direct"), "off"),
                                               args.seconds, calls["direct"])),
                        threading.Thread(target=poll,
                                         args=(child_env(cache_proxy.addr, cache_state, "on"),
                                               args.seconds, calls["cache"])),
                    ]
                    for loop in loops:
                        loop.start()
                    for loop in loops:
                        loop.join()
                    result = {"direct": summary(direct_proxy, calls["direct"]),
                              "cache": summary(cache_proxy, calls["cache"])}
        finally:
            kill_watchers(cache_state)

    print(f"Consul load of one job polling every second for {args.seconds:g} s, {args.instances} instances, "
          f"nothing changing; {load_note(load)}")
    print(f"{'job':<8}{'calls':>7}{'failed':>8}{'health answers':>16}{'of which blocking':>19}"
          f"{'parked at end':>15}{'MB sent':>10}")
    for name, r in result.items():
        print(f"{name:<8}{r['calls']:>7}{r['failures']:>8}{r['health_answers']:>16}{r['blocking_answers']:>19}"
              f"{r['parked_at_end']:>15}{r['bytes_sent'] / 1e6:>10.2f}")
    d, c = result["direct"], result["cache"]
    print(f"cache / direct: {c['health_answers']}/{d['health_answers']} answers, "
          f"{c['bytes_sent'] / max(d['bytes_sent'], 1):.3f}x the bytes")
    write_json(result_path(args, "discovery_load"), {"instances": args.instances, "seconds": args.seconds, **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
