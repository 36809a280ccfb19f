"""``hvd-elastic demo``: one elastic training job, resized only through Consul.

Everything runs on this machine, the way ``consul agent -dev`` runs Consul:

1. an embedded Consul-compatible dev agent simulates two GPU nodes, ``localhost``
   and ``127.0.0.1`` (horovodrun treats them as two hosts, both local);
2. a node agent per node registers the training service with its slots and
   keeps a TTL check passing;
3. ``horovodrun`` runs ``examples/train_elastic.py`` elastically with
   ``discovery/consul_hosts`` as its host discovery script;
4. the demo drains ``127.0.0.1`` (the job shrinks without a rollback), undrains
   it (the job grows back), then kills the WHOLE job and starts it again: it
   resumes from its last durable checkpoint and finishes.

It prints a timeline and a summary, and exits 0 only when the job went through
every phase and finished.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hvd_elastic.discovery.options import non_negative_float, positive_float, positive_int
from hvd_elastic.training.events import EventLog

log = logging.getLogger("hvd_elastic.demo")

REPO = Path(__file__).resolve().parent.parent
NODES = ("localhost", "127.0.0.1")
SERVICE = "horovod"


class DemoFailed(RuntimeError):
    pass


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", help="where checkpoints and logs go (default: a new temporary directory)")
    parser.add_argument("--epochs", type=positive_int, default=3, help="training epochs (default %(default)s)")
    parser.add_argument("--samples", type=positive_int, default=3072, help="dataset size (default %(default)s)")
    parser.add_argument("--step-delay", type=non_negative_float, default=0.05,
                        help="seconds of simulated compute per step (default %(default)s)")
    parser.add_argument("--phase-steps", type=positive_int, default=12,
                        help="steps to train between membership changes (default %(default)s)")
    parser.add_argument("--timeout", type=positive_float, default=240.0,
                        help="seconds each phase may take before the demo gives up (default %(default)s)")


class Job:
    """One horovodrun process group and the progress log its rank 0 writes."""

    def __init__(self, args: argparse.Namespace, workdir: Path, consul_addr: str, attempt: int):
        self.progress = workdir / "progress.jsonl"
        self.log_path = workdir / f"horovodrun.{attempt}.log"
        bindir = os.path.dirname(sys.executable)
        env = dict(os.environ, CONSUL_HTTP_ADDR=consul_addr, PYTHONUNBUFFERED="1",
                   PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
                   HOROVOD_GLOO_TIMEOUT_SECONDS="30")
        command = [
            os.path.join(bindir, "horovodrun"), "-np", "2", "--min-np", "1", "--max-np", "2",
            "--host-discovery-script", str(REPO / "discovery" / "consul_hosts"),
            sys.executable, str(REPO / "examples" / "train_elastic.py"), "--workdir", str(workdir),
            "--epochs", str(args.epochs), "--samples", str(args.samples), "--step-delay", str(args.step_delay),
        ]
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(command, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def records(self) -> list[dict]:
        if not self.progress.exists():
            return []
        with open(self.progress) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]

    def wait_steps(self, size: int, steps: int, timeout: float, what: str) -> None:
        """Wait until ``steps`` steps were committed at world size ``size`` since now."""
        start = len(self.records())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = sum(1 for r in self.records()[start:] if r["size"] == size)
            if done >= steps:
                return
            if self.proc.poll() is not None:
                raise DemoFailed(f"{what}: horovodrun exited with {self.proc.returncode}; see {self.log_path}")
            time.sleep(0.2)
        raise DemoFailed(f"{what}: no {steps} steps at world size {size} within {timeout:.0f}s; see {self.log_path}")

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._log.close()

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.kill()
            self._log.close()


def _hvd_elastic(*args: str, consul_addr: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, CONSUL_HTTP_ADDR=consul_addr)
    return subprocess.run([sys.executable, "-m", "hvd_elastic.cli", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def _start_node_agent(node: str, consul_addr: str, workdir: Path) -> subprocess.Popen:
    env = dict(os.environ, CONSUL_HTTP_ADDR=consul_addr)
    with open(workdir / f"node-agent.{node}.log", "w") as log_file:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "hvd_elastic.cli", "node-agent", "--service", SERVICE, "--slots", "1",
             "--ttl", "5", "--checkpoint-path", str(workdir), "--min-free-disk", "64M", "--min-free-memory", "64M"],
            env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_discovered(consul_addr: str, expected: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = _hvd_elastic("discover", consul_addr=consul_addr)
        if out.returncode == 0 and sorted(out.stdout.split()) == sorted(expected):
            return
        time.sleep(0.3)
    raise DemoFailed(f"discovery never printed {expected}")


def _say(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _summary(workdir: Path) -> list[dict]:
    events = EventLog.read(workdir / "events.jsonl")
    for event in events:
        if event["event"] == "reset":
            print(f"  reset    {event['reason']:<14} {event.get('hosts', event.get('message', ''))!s:<8} "
                  f"size {event['old_size']} -> {event['new_size']}")
        elif event["event"] == "resume":
            print(f"  resume   from {Path(event['path']).name} at step {event['step']} (epoch {event['epoch']})")
    checkpoints = [e for e in events if e["event"] == "checkpoint"]
    syncs = [e["seconds"] for e in events if e["event"] == "sync"]
    commits = [e["seconds"] for e in events if e["event"] == "commit"]
    print(f"  {len(checkpoints)} checkpoints written, {len(commits)} commits "
          f"(median {1e3 * sorted(commits)[len(commits) // 2]:.2f} ms)" if commits else "  no commits logged")
    if syncs:
        print(f"  {len(syncs)} syncs (median {1e3 * sorted(syncs)[len(syncs) // 2]:.1f} ms)")
    return events


def run_demo(args: argparse.Namespace, workdir: Path) -> int:
    from hvd_elastic.devagent import DevCluster

    agents: dict[str, subprocess.Popen] = {}
    job: Job | None = None
    with DevCluster(nodes=list(NODES)) as cluster:
        addr = {node: cluster.addr(node) for node in NODES}
        _say(f"Consul dev agents: {', '.join(f'{n} at {a}' for n, a in addr.items())}")
        try:
            for node in NODES:
                agents[node] = _start_node_agent(node, addr[node], workdir)
            _wait_discovered(addr["localhost"], ["localhost:1", "127.0.0.1:1"], timeout=30)
            _say("node agents registered; discovery prints localhost:1 and 127.0.0.1:1")

            job = Job(args, workdir, addr["localhost"], attempt=1)
            job.wait_steps(2, args.phase_steps, args.timeout, "start")
            _say(f"training at world size 2 (log: {job.log_path})")

            out = _hvd_elastic("drain", "--service", SERVICE, "--reason", "demo: node reclaimed",
                               consul_addr=addr["127.0.0.1"])
            _say(f"hvd-elastic drain on 127.0.0.1: {out.stdout.strip() or out.stderr.strip()}")
            job.wait_steps(1, args.phase_steps, args.timeout, "drain")
            _say("job shrank to world size 1 without a rollback")

            out = _hvd_elastic("undrain", "--service", SERVICE, consul_addr=addr["127.0.0.1"])
            _say(f"hvd-elastic undrain on 127.0.0.1: {out.stdout.strip() or out.stderr.strip()}")
            job.wait_steps(2, args.phase_steps, args.timeout, "undrain")
            _say("job grew back to world size 2")

            job.kill()
            last = job.records()[-1]
            _say(f"killed the whole job (SIGKILL) at step {last['step']}, epoch {last['epoch']}")

            job = Job(args, workdir, addr["localhost"], attempt=2)
            _say("started the job again with the same --workdir")
            code = job.wait(args.timeout * 2)
            if code != 0:
                raise DemoFailed(f"restarted job exited with {code}; see {job.log_path}")
            final = job.records()[-1]
            _say(f"job finished: epoch {args.epochs}, step {final['step']}, loss {final['loss']}")
        finally:
            if job is not None and job.proc.poll() is None:
                job.kill()
            for proc in agents.values():
                proc.terminate()
            for proc in agents.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
    print("summary (from events.jsonl):")
    events = _summary(workdir)
    resets = [(e["old_size"], e["new_size"]) for e in events if e["event"] == "reset"]
    if not any(e["event"] == "resume" for e in events):
        raise DemoFailed("the restarted job did not resume from a checkpoint")
    if (2, 1) not in resets or (1, 2) not in resets:
        raise DemoFailed(f"expected a shrink 2->1 and a growth 1->2, saw resets {resets}")
    return 0


def run(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="hvd-elastic-demo."))
    workdir.mkdir(parents=True, exist_ok=True)
    _say(f"workdir {workdir}")
    try:
        code = run_demo(args, workdir)
    except DemoFailed as exc:
        print(f"demo: FAILED: {exc}", file=sys.stderr)
        return 1
    _say("demo OK")
    return code
