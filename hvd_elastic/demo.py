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
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hvd_elastic.discovery.options import non_negative_float, positive_float, positive_int
from hvd_elastic.testbed import (CONSUL_HOSTS, REPO, Job, JobError, JsonLines, child_env, horovodrun_elastic,
                                 start_node_agent, wait_until)
from hvd_elastic.training.events import EventLog

log = logging.getLogger("hvd_elastic.demo")

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


def _training_job(args: argparse.Namespace, workdir: Path, env: dict[str, str]) -> Job:
    """horovodrun running examples/train_elastic.py on the hosts Consul lists; each start() is one attempt."""
    cmd = [*horovodrun_elastic(CONSUL_HOSTS, 2, 1, 2),
           sys.executable, REPO / "examples" / "train_elastic.py", "--workdir", workdir,
           "--epochs", args.epochs, "--samples", args.samples, "--step-delay", args.step_delay]
    return Job(cmd, env=dict(env, HOROVOD_GLOO_TIMEOUT_SECONDS="30"), logdir=workdir, name="horovodrun")


def _wait_steps(job: Job, progress: JsonLines, size: int, steps: int, timeout: float, what: str) -> None:
    """Wait until ``steps`` steps were committed at world size ``size`` since now."""
    start = len(progress.rows())
    try:
        job.wait_until(f"{steps} steps at world size {size}",
                       lambda: sum(1 for r in progress.rows()[start:] if r["size"] == size) >= steps, timeout, 0.2)
    except JobError as exc:
        raise DemoFailed(f"{what}: {str(exc).splitlines()[0]}; see {job.logs[-1]}") from None


def _hvd_elastic(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hvd_elastic.cli", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def _start_node_agent(node: str, env: dict[str, str], workdir: Path) -> Job:
    return start_node_agent("--service", SERVICE, "--slots", "1", "--ttl", "5", "--checkpoint-path", str(workdir),
                            "--min-free-disk", "64M", "--min-free-memory", "64M",
                            env=env, logdir=workdir, name=f"node-agent.{node}")


def _stop_node_agents(agents: list[Job]) -> None:
    """SIGTERM, so each agent deregisters; one that does not stop within 10 s is killed."""
    for agent in agents:
        with contextlib.suppress(JobError):
            agent.stop(timeout=10)


def _wait_discovered(env: dict[str, str], expected: list[str], timeout: float) -> None:
    def listed() -> bool:
        out = _hvd_elastic("discover", env=env)
        return out.returncode == 0 and sorted(out.stdout.split()) == sorted(expected)

    try:
        wait_until(f"discovery to print {expected}", listed, timeout, interval=0.3)
    except JobError:
        raise DemoFailed(f"discovery never printed {expected}") from None


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

    progress = JsonLines(workdir / "progress.jsonl")
    # The ExitStack ends everything the demo started, on every path: the job first,
    # then the node agents (gracefully, then for sure), then the dev agent.
    with DevCluster(nodes=list(NODES)) as cluster, contextlib.ExitStack() as cleanup:
        addr = {node: cluster.addr(node) for node in NODES}
        # The user's own settings (HVD_ELASTIC_*, CONSUL_*) reach every child; only the agent address is the demo's.
        env = {node: child_env(scrub=False, CONSUL_HTTP_ADDR=addr[node]) for node in NODES}
        _say(f"Consul dev agents: {', '.join(f'{n} at {a}' for n, a in addr.items())}")
        agents = [cleanup.enter_context(_start_node_agent(node, env[node], workdir)) for node in NODES]
        cleanup.callback(_stop_node_agents, agents)
        _wait_discovered(env["localhost"], ["localhost:1", "127.0.0.1:1"], timeout=30)
        _say("node agents registered; discovery prints localhost:1 and 127.0.0.1:1")

        job = cleanup.enter_context(_training_job(args, workdir, env["localhost"]))
        job.start()
        _wait_steps(job, progress, 2, args.phase_steps, args.timeout, "start")
        _say(f"training at world size 2 (log: {job.logs[-1]})")

        out = _hvd_elastic("drain", "--service", SERVICE, "--reason", "demo: node reclaimed", env=env["127.0.0.1"])
        _say(f"hvd-elastic drain on 127.0.0.1: {out.stdout.strip() or out.stderr.strip()}")
        _wait_steps(job, progress, 1, args.phase_steps, args.timeout, "drain")
        _say("job shrank to world size 1 without a rollback")

        out = _hvd_elastic("undrain", "--service", SERVICE, env=env["127.0.0.1"])
        _say(f"hvd-elastic undrain on 127.0.0.1: {out.stdout.strip() or out.stderr.strip()}")
        _wait_steps(job, progress, 2, args.phase_steps, args.timeout, "undrain")
        _say("job grew back to world size 2")

        job.kill()
        last = progress.rows()[-1]
        _say(f"killed the whole job (SIGKILL) at step {last['step']}, epoch {last['epoch']}")

        job.start()
        _say("started the job again with the same --workdir")
        try:
            code = job.wait(args.timeout * 2)
        except JobError:
            raise DemoFailed(f"restarted job did not finish within {args.timeout * 2:.0f}s; see {job.logs[-1]}") from None
        if code != 0:
            raise DemoFailed(f"restarted job exited with {code}; see {job.logs[-1]}")
        final = progress.rows()[-1]
        _say(f"job finished: epoch {args.epochs}, step {final['step']}, loss {final['loss']}")
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
