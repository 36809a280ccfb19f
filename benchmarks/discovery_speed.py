"""How long one host-discovery call takes: warm host cache, cold start, direct query.

horovodrun runs its ``--host-discovery-script`` every second, and once more
on every reset, while holding a lock: the call's wall time is dead time for the
driver.  Targets (issue 9): with a warm host cache, a call takes at most 2x
the same interpreter started with the same flags doing nothing, in the same
run:

* ``discovery/consul_hosts`` runs ``python3 -I -S``: baseline
  ``python3 -I -S -c pass``;
* ``hvd-elastic discover`` is a console script whose interpreter starts
  without flags: baseline ``python3 -c pass`` (the venv's python, the one its
  shebang names).  Its ratio to ``python3 -I -S -c pass`` is printed too.

Every round runs each command once, in a fixed order, so load that hits a
round hits baseline and measured alike; ratios are taken round by round
(``report.paired_ratio``).  ``python3`` is the venv's (first on PATH).

Set-up: the Consul dev agent in its own process (``--consul consul``:
HashiCorp Consul, a server agent and a client agent per node) with
``--instances`` passing instances spread over ``--nodes`` nodes, each with its
own service address;
discovery runs with ``--host-name service-address`` so it prints one line per
instance (the heaviest case).  The warm-cache calls are children of this
process, which stands in for horovodrun (``HVD_ELASTIC_DISCOVERY_CACHE=on``):
the first call starts the job's watcher, later calls read its file.  The
operator's-cache row reads the file of a ``hvd-elastic discover --watch``
process through ``--cache-file`` (its first call checks the settings and
leaves an alias, later ones read the file without parsing flags).

The direct rows (``--cache off --timeout 30``: room for a slow answer, which
at the default 0.8 s would fail) come in two kinds: repeated calls with no
change in between are served from the dev agent's response cache (the body
is rendered once per index, as a real agent's is not); the "agent cache
defeated" row changes one check's output before each call, so every call
gets a freshly rendered answer.  Cold start: a job's first call (a fresh
state directory each time): a direct query plus starting the watcher; the
time until that watcher's first answer is in the file is reported too.

    python benchmarks/discovery_speed.py [--instances 1000] [--runs 30] [--cold-runs 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: testbed/ is not installed
sys.path.insert(0, str(Path(__file__).resolve().parent))

from testbed.hostcache import fresh_record, read_record  # noqa: E402
from testbed import CONSUL_HOSTS, child_env as testbed_env  # noqa: E402
from testbed import start_dev_agent  # noqa: E402
from hvd_elastic.local.realconsul import ConsulCluster  # noqa: E402
from report import RESULTS, Row, format_table, load_note, paired_ratio, spread, write_json  # noqa: E402

VENV_BIN = Path(sys.executable).parent
SERVICE = "horovod"
ARGS = ["--host-name", "service-address"]
# Direct calls get room to answer: at 10,000 instances on a loaded machine a fresh answer takes longer
# than the default 0.8 s and the call would fail (the very problem the cache solves).
DIRECT = [*ARGS, "--cache", "off", "--timeout", "30"]
BASE_ISOLATED = "python3 -I -S -c pass"
BASE_PLAIN = "python3 -c pass"


def cluster_parser(doc: str, name: str) -> argparse.ArgumentParser:
    """The arguments every discovery benchmark shares: cluster size and where the JSON goes."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=4, help="Consul nodes the instances are spread over")
    parser.add_argument("--consul", choices=("dev", "consul"), default="dev",
                        help="the dev agent in its own process, or HashiCorp Consul (a server and a client agent "
                             "per node, .venv/bin/consul) (default %(default)s)")
    parser.add_argument("--json", default=None, help=f"default benchmarks/results/{name}_<instances>.json")
    return parser


def result_path(args: argparse.Namespace, name: str) -> Path:
    suffix = "_consul" if getattr(args, "consul", "dev") == "consul" else ""
    return Path(args.json) if args.json else RESULTS / f"{name}_{args.instances}{suffix}.json"


@contextlib.contextmanager
def dev_agent(workdir: Path, nodes: int, instances: int = 0, kind: str = "dev") -> Iterator[dict[str, str]]:
    """Consul for ``nodes`` nodes with ``instances`` registered (see :func:`register`): {node: host:port}.

    ``kind`` "dev": the dev agent in its own process, as Consul runs; "consul": HashiCorp Consul
    (:class:`~hvd_elastic.local.realconsul.ConsulCluster`: a server and a client agent per node).
    """
    names = [f"node{i}" for i in range(nodes)]
    if kind == "consul":
        with ConsulCluster(names) as cluster:
            register(cluster.addresses(), instances)
            yield cluster.addresses()
        return
    job, addresses = start_dev_agent(names, env=testbed_env(), logdir=workdir)
    try:
        register(addresses, instances)
        yield addresses
    finally:
        job.stop()


def request(addr: str, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(method, path, body=body)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def register(addresses: dict[str, str], instances: int) -> None:
    """``instances`` passing instances round-robin over the nodes, one service address each."""
    nodes = list(addresses.values())
    for i in range(instances):
        body = json.dumps({
            "Name": SERVICE, "ID": f"{SERVICE}-{i}", "Address": f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
            "Meta": {"slots": "8", "gpu_model": "NVIDIA H100 80GB HBM3"}, "Tags": ["gpu"],
            "Check": {"TTL": "3600s", "Status": "passing"},
        }).encode()
        status, answer = request(nodes[i % len(nodes)], "PUT", "/v1/agent/service/register", body)
        assert status == 200, answer


def wall(cmd: list[str], env: dict[str, str], expect_lines: int | None = None) -> float:
    start = time.perf_counter()
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, start_new_session=True, timeout=120)
    elapsed = time.perf_counter() - start
    assert result.returncode == 0, result.stderr[-500:]
    if expect_lines is not None:
        assert result.stdout.count("\n") == expect_lines, (result.stdout.count("\n"), result.stderr[-500:])
    return elapsed


def private_dir(parent: Path, name: str) -> Path:
    path = parent / name
    path.mkdir(mode=0o700)
    return path


def child_env(addr: str, state: Path, cache: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONSUL_", "HVD_ELASTIC_", "PYTHON"))}
    env.update(PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", CONSUL_HTTP_ADDR=addr,
               HVD_ELASTIC_DISCOVERY_STATE_DIR=str(state), HVD_ELASTIC_DISCOVERY_CACHE=cache)
    return env


def rounds(commands: dict[str, tuple[list[str], dict, int | None]], runs: int,
           before_each=None) -> dict[str, list[float]]:
    """Interleaved rounds: every command once per round, in order; one warm-up round first."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for n in range(runs + 1):
        for name, (cmd, env, lines) in commands.items():
            if before_each is not None and lines is not None:
                before_each()
            elapsed = wall(cmd, env, lines)
            if n:
                times[name].append(elapsed)
    return times


def stop_watchers(state: Path) -> None:
    rec = fresh_record(state)
    if rec is not None:
        os.kill(rec.pid, signal.SIGTERM)


def measure(args: argparse.Namespace, addresses: dict[str, str], workdir: Path) -> dict:
    addr = next(iter(addresses.values()))
    n = args.instances
    warm_state = private_dir(workdir, "warm")
    warm_env = child_env(addr, warm_state, "on")
    off_env = child_env(addr, private_dir(workdir, "off"), "off")
    base_env = child_env(addr, private_dir(workdir, "base"), "off")
    consul_hosts = [str(CONSUL_HOSTS), *ARGS]
    discover = [str(VENV_BIN / "hvd-elastic"), "discover", *ARGS]
    consul_hosts_direct = [str(CONSUL_HOSTS), *DIRECT]
    discover_direct = [str(VENV_BIN / "hvd-elastic"), "discover", *DIRECT]

    wall(consul_hosts, warm_env, n)  # the job's first call: starts its watcher
    op_dir = workdir / "run"
    op_dir.mkdir()
    op_file = op_dir / "horovod.hosts"
    operator = subprocess.Popen([str(VENV_BIN / "hvd-elastic"), "--log-level", "WARNING", "discover", "--watch",
                                 "--cache-file", str(op_file), *ARGS], env=base_env, start_new_session=True)
    deadline = time.monotonic() + 120
    while fresh_record(warm_state) is None or read_record(op_file) is None or read_record(op_file).error:
        assert time.monotonic() < deadline and operator.poll() is None, "a watcher never answered"
        time.sleep(0.05)
    consul_hosts_op = [str(CONSUL_HOSTS), *ARGS, "--cache-file", str(op_file)]
    op_env = child_env(addr, private_dir(workdir, "op-state"), "auto")

    main = rounds({
        BASE_ISOLATED: (["python3", "-I", "-S", "-c", "pass"], base_env, None),
        BASE_PLAIN: (["python3", "-c", "pass"], base_env, None),
        "consul_hosts, warm cache": (consul_hosts, warm_env, n),
        "hvd-elastic discover, warm cache": (discover, warm_env, n),
        "consul_hosts, operator's cache (--cache-file)": (consul_hosts_op, op_env, n),
        "consul_hosts, direct (agent response cache)": (consul_hosts_direct, off_env, n),
        "hvd-elastic discover, direct (agent response cache)": (discover_direct, off_env, n),
    }, args.runs)
    stop_watchers(warm_state)
    os.killpg(operator.pid, signal.SIGTERM)
    operator.wait(timeout=60)

    bump = iter(range(10 ** 9))

    def defeat_agent_cache() -> None:  # an output change takes a new index: the agent renders afresh
        body = json.dumps({"Status": "passing", "Output": f"round {next(bump)}"}).encode()
        status, _ = request(addr, "PUT", f"/v1/agent/check/update/service:{SERVICE}-0", body)
        assert status == 200

    defeated = rounds({
        BASE_ISOLATED: (["python3", "-I", "-S", "-c", "pass"], base_env, None),
        "consul_hosts, direct (agent cache defeated)": (consul_hosts_direct, off_env, n),
    }, args.runs, before_each=defeat_agent_cache)

    cold, first_answer = [], []
    cold_base = []
    for i in range(args.cold_runs):
        state = private_dir(workdir, f"cold{i}")
        cold_base.append(wall(["python3", "-I", "-S", "-c", "pass"], base_env))
        start = time.perf_counter()
        cold.append(wall(consul_hosts, child_env(addr, state, "on"), n))
        while fresh_record(state) is None:
            assert time.perf_counter() - start < 120, "the watcher never answered"
            time.sleep(0.01)
        first_answer.append(time.perf_counter() - start)
        stop_watchers(state)

    http_times, size = [], 0
    for _ in range(args.runs):
        start = time.perf_counter()
        status, body = request(addr, "GET", f"/v1/health/service/{SERVICE}?passing=1")
        http_times.append(time.perf_counter() - start)
        assert status == 200
        size = len(body)

    def row(label, samples, baseline=None, base_samples=None, target=None):
        ratio = paired_ratio(samples, base_samples) if baseline else None
        return Row(label, spread(samples), baseline=baseline, ratio=ratio, target=target)

    iso, plain = main[BASE_ISOLATED], main[BASE_PLAIN]
    rows = [
        row(BASE_ISOLATED, iso),
        row(BASE_PLAIN, plain),
        row("consul_hosts, warm cache", main["consul_hosts, warm cache"], BASE_ISOLATED, iso, 2.0),
        row("hvd-elastic discover, warm cache", main["hvd-elastic discover, warm cache"], BASE_PLAIN, plain, 2.0),
        row("hvd-elastic discover, warm cache", main["hvd-elastic discover, warm cache"], BASE_ISOLATED, iso),
        row("consul_hosts, operator's cache (--cache-file)", main["consul_hosts, operator's cache (--cache-file)"],
            BASE_ISOLATED, iso, 2.0),
        row("consul_hosts, direct (agent response cache)", main["consul_hosts, direct (agent response cache)"],
            BASE_ISOLATED, iso),
        row("hvd-elastic discover, direct (agent response cache)",
            main["hvd-elastic discover, direct (agent response cache)"], BASE_PLAIN, plain),
        row("consul_hosts, direct (agent cache defeated)", defeated["consul_hosts, direct (agent cache defeated)"],
            BASE_ISOLATED, defeated[BASE_ISOLATED]),
        row("consul_hosts, cold start (first call of a job)", cold, BASE_ISOLATED, cold_base),
        row("cold start until the watcher's first answer", first_answer),
        row("health query HTTP round trip (http.client, agent response cache)", http_times),
    ]
    return {"instances": n, "nodes": args.nodes, "runs": args.runs, "cold_runs": args.cold_runs,
            "health_response_bytes": size, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = cluster_parser(__doc__, "discovery_speed")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--cold-runs", type=int, default=5)
    args = parser.parse_args(argv)
    if min(args.instances, args.nodes, args.runs, args.cold_runs) < 1 or args.instances > 65536 * 256:
        parser.error("--instances, --nodes, --runs and --cold-runs must be >= 1")

    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="discovery-speed-") as tmp:
        with dev_agent(Path(tmp), args.nodes, args.instances, args.consul) as addresses:
            result = measure(args, addresses, Path(tmp))
    result["consul"] = "HashiCorp Consul 1.8.7" if args.consul == "consul" else "the dev agent"
    title = (f"discovery against {result['instances']} healthy instances "
             f"({result['health_response_bytes'] / 1e6:.2f} MB answer) "
             f"on {result['consul']}, "
             f"{args.runs} interleaved rounds, {args.cold_runs} cold starts; {load_note(load)}")
    print(format_table(title, result["rows"]))
    write_json(result_path(args, "discovery_speed"), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
