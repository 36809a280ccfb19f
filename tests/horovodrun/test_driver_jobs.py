"""horovodrun's driver under hvd-elastic's rules (:mod:`hvd_elastic.horovodrun.rules`), on real jobs.

Elastic horovodrun on two local hosts (``localhost``, ``127.0.0.1``) with a host-file discovery
script, so the test drives membership; ``HVD_ELASTIC_DRIVER=1`` applies the rules to it as they
apply by default to hvd-elastic's own discovery.  Each test is a failure that stock Horovod 0.28.1
turns into a dead or wedged job, reproduced directly (no soak):

* every worker of a round fails (both SIGKILLed at once): stock Horovod ends the job ("failure count
  == 2 -> stop running"); here the driver starts a new world on the returning hosts, it resumes from
  the checkpoint, and the job ends with the fault matrix's verdict;
* a host is lost during the job's first rendezvous (its worker ends before ``hvd.init()``): the
  others abort once Gloo's rendezvous times out, so every worker of the round failed and stock
  Horovod ends the job; here nothing had trained, so the driver starts a new world without it;
* the job falls below ``--min-np`` and the last worker dies while the driver waits for hosts: stock
  Horovod records that worker at a barrier no round will fill and stays alive forever with no
  worker, deaf to SIGTERM; here it ends once its wait times out;
* SIGTERM while the driver waits for hosts: stock Horovod terminates the workers and keeps waiting
  (``HOROVOD_ELASTIC_TIMEOUT``, 600 s by default); here it exits 143 at once;
* a worker dies in a world on one host: stock Horovod blacklists the host, finds every host of the
  round blacklisted and ends the job ("blacklisted slots count == 1 -> stop running"); here the host
  returns after its cooldown and the job resumes from the checkpoint;
* the job falls below ``--min-np`` when a worker dies, and its host returns after its cooldown while the
  driver still waits for hosts: stock Horovod finds the host's slot in the previous world, counts it as
  running and starts no worker for it, so the survivor waits for a rank that never comes and the next
  round never fills (horovodrun alive, nothing trains); here the slot gets a new worker;
* the same, with the survivor's host gone meanwhile: no host of the last world is in the next, so no
  survivor can hand it the state (stock Horovod wedges as above; freeing the slot alone would end the
  job, "No hosts from previous set remaining"); here the next world resumes from the checkpoint;
* a host of the next world is lost while the survivors re-initialise (the newcomer's worker ends
  before ``hvd.init()``): stock Horovod's survivors wait out Gloo's rendezvous timeout inside
  ``hvd.init()`` and abort, state and all; here they go on to the world after it and keep their state;
* a worker is stuck inside a given-up world's rendezvous (past the store, connecting to a peer cut off;
  here it sleeps before ``hvd.init()``, which the driver cannot tell apart): the round never ends
  without it, so the job waits out the connection timeout, minutes; here it is ended 5 s after the
  world was given up and the next world trains;
* a host of the next world is lost while the survivors connect their Gloo pairs inside ``hvd.init()``
  (here the joiner's addresses, published by the test, lead to a socket that never answers, and the
  joiner itself is killed before its ``hvd.init()``): the survivors can never complete the rendezvous
  and stock Horovod's wait out Gloo's timeout; here each leaves ``hvd.init()`` 2 s after the driver gave
  the world up (exit 75) and the next world resumes from the checkpoint;
* the job finishes while a host joins (join-ahead keeps the survivor training while the joiner
  starts; here the joiner sleeps before ``hvd.init()``): horovodrun waits for the joiner, which waits
  out its Gloo timeout and fails, and then exits 1 for a job that finished; here the joiner is ended
  as the survivor exits and horovodrun exits 0.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import sys
import time
import json
from pathlib import Path

import psutil
import pytest

from testbed import VENV_BIN, JsonLines, Job, child_env, horovodrun_elastic, host_file_discovery
from hvd_elastic.report.ledger import run_problems
from hvd_elastic.training.checkpoint import CheckpointManager
from hvd_elastic.training.events import EventLog
from hvd_elastic.training._internal.rendezvous import Server

pytestmark = pytest.mark.slow

WAIT = 240.0  # hang guards, not speed bounds
BOTH = "localhost:1\n127.0.0.1:1\n"


def workers(out: Path, every: bool = False) -> dict:
    """The job's training processes by host (not the shells Horovod starts them through); ``every``: by
    (host, local rank)."""
    found = {}
    for proc in psutil.process_iter(["cmdline", "environ"], ad_value=None):
        cmd = proc.info["cmdline"] or []
        if cmd[1:3] == ["-m", "testbed.worker"] and str(out) in cmd:
            env = proc.info["environ"] or {}
            host = env.get("HOROVOD_HOSTNAME")
            found[(host, env.get("HOROVOD_LOCAL_RANK")) if every else host] = proc
    return found


def start(tmp_path: Path, *, min_np: int, max_np: int = 2, args: tuple[str, ...] = (), hosts: str = BOTH,
          **env: str) -> tuple[Job, Path, JsonLines]:
    """The job on ``hosts`` (both by default), training at world size 2 (``--samples`` keeps epochs short)."""
    out = tmp_path / "job"
    out.mkdir()
    job = launch(tmp_path, out, min_np=min_np, max_np=max_np, args=args, hosts=hosts, **env)
    progress = JsonLines(out / "progress.jsonl")
    job.wait_until("4 steps at world size 2", lambda: sum(r["size"] == 2 for r in progress.rows()) >= 4, WAIT)
    job.wait_until("both workers", lambda: len(workers(out, every=True)) == 2, WAIT)
    return job, out, progress


def launch(tmp_path: Path, out: Path, *, min_np: int, max_np: int = 2, args: tuple = (), hosts: str = BOTH,
           name: str = "horovodrun", np: int = 2, **env: str) -> Job:
    """The job on ``hosts`` writing to ``out``, started with ``np`` workers (a host file of its own per ``name``)."""
    discovery = host_file_discovery(tmp_path / ("hosts" if name == "horovodrun" else f"hosts.{name}"), hosts)
    # One host cannot show horovodrun which interfaces its hosts share: name it, as a one-node job must.
    nics = ["--network-interface", "lo"] if hosts.count("\n") == 1 else []
    cmd = [*horovodrun_elastic(discovery, np, min_np, max_np, *nics), sys.executable, "-m", "testbed.worker",
           "--out", out, "--samples", "96", "--checkpoint-every", "3", *args]
    return Job(cmd, env=child_env(HVD_ELASTIC_DRIVER="1", HOROVOD_GLOO_TIMEOUT_SECONDS="60", **env),
               logdir=tmp_path, name=name).start()


def kill_after_a_checkpoint_then_finish(job: Job, out: Path, progress: JsonLines, victims: list) -> None:
    """Once a checkpoint exists, SIGKILL ``victims``; wait for a step at world size 2 after it; end the job."""
    with job:
        job.wait_until("a durable checkpoint", lambda: CheckpointManager(out / "ckpt").checkpoints(), WAIT)
        for proc in victims:
            proc.send_signal(signal.SIGKILL)
        killed = time.time()
        job.wait_until("a step at world size 2 after the kill",
                       lambda: any(r["time"] > killed and r["size"] == 2 for r in progress.rows()), WAIT)
        (out / "stop").touch()
        job.finish(WAIT)


def test_a_round_in_which_every_worker_fails_restarts_from_the_checkpoint_in_the_same_job(tmp_path):
    job, out, progress = start(tmp_path, min_np=2)
    kill_after_a_checkpoint_then_finish(job, out, progress, list(workers(out).values()))
    log = job.read_log()
    assert "hvd-elastic: every worker of the round failed (exit codes [137]): starting a new world" in log, log[-3000:]
    assert "stop running" not in log, log[-3000:]
    assert not run_problems(out), run_problems(out)
    resumes = EventLog.read(out / "events.jsonl", event="resume")
    assert len(resumes) == 1 and resumes[0]["step"] >= 3, resumes


def test_a_worker_lost_in_a_world_on_one_host_resumes_when_the_host_returns(tmp_path):
    job, out, progress = start(tmp_path, min_np=1, hosts="localhost:2\n")
    kill_after_a_checkpoint_then_finish(job, out, progress, [workers(out, every=True)[("localhost", "1")]])
    log = job.read_log()
    assert "hvd-elastic: every host of the round had a worker fail (exit codes [137]): starting a new world" in log, \
        log[-3000:]
    assert "stop running" not in log, log[-3000:]
    assert not run_problems(out), run_problems(out)
    assert len(EventLog.read(out / "events.jsonl", event="resume")) == 1


def test_a_host_lost_during_the_first_rendezvous_does_not_end_the_job(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    hosts = tmp_path / "hosts"
    cmd = [*horovodrun_elastic(host_file_discovery(hosts, BOTH), 2, 1, 2), sys.executable,
           Path(__file__).parents[1] / "training_run" / "worker_train.py"]
    env = child_env(HVD_ELASTIC_DRIVER="1", HOROVOD_GLOO_TIMEOUT_SECONDS="10", OUT_DIR=str(out), EPOCHS="1",
                    FAIL_ON_HOST="127.0.0.1", PATH=f"{VENV_BIN}:{os.environ['PATH']}")
    with Job(cmd, env=env, logdir=tmp_path, name="horovodrun").start() as job:
        job.wait_until("127.0.0.1's worker to end before hvd.init()",
                       lambda: "exit with status code 3" in job.read_log(), WAIT)
        hosts.write_text("localhost:1\n")  # the host is gone for good
        job.finish(WAIT)
    log = job.read_log()
    assert "hvd-elastic: every worker of the round failed (exit codes [" in log, log[-3000:]
    assert "starting a new world" in log and "stop running" not in log, log[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["size"] == 1 and result["offset"] == 256, result  # the whole epoch, on the host that stayed


@pytest.mark.parametrize("then", ["last worker dies", "SIGTERM"])
def test_horovodrun_below_min_np_ends_when_it_must(tmp_path, then):
    job, out, _ = start(tmp_path, min_np=2, HOROVOD_ELASTIC_TIMEOUT="8")
    with job:
        (tmp_path / "hosts").write_text("localhost:1\n")  # 127.0.0.1 leaves for good: below --min-np
        workers(out)["127.0.0.1"].send_signal(signal.SIGKILL)
        time.sleep(3)  # the survivor has reset and the driver waits for a second host
        began = time.monotonic()
        if then == "SIGTERM":
            os.kill(job.pid, signal.SIGTERM)
        else:
            workers(out)["localhost"].send_signal(signal.SIGKILL)
        code = job.wait(60)  # stock Horovod: alive until SIGKILL (or, after SIGTERM, HOROVOD_ELASTIC_TIMEOUT)
        took = time.monotonic() - began
        assert not workers(out), "a worker outlived horovodrun"
    log = job.read_log()
    if then == "SIGTERM":
        assert code == 128 + signal.SIGTERM, (code, log[-3000:])
        assert took < 20, f"horovodrun took {took:.1f} s to end after SIGTERM"
        assert "hvd-elastic: horovodrun got SIGTERM: stopping the driver and its workers" in log
    else:
        assert code == 1, (code, log[-3000:])
        assert "failed to activate new hosts -> stop running" in log, log[-3000:]


def test_a_host_back_from_its_cooldown_while_the_driver_waits_gets_a_new_worker(tmp_path):
    job, out, progress = start(tmp_path, min_np=2)
    with job:
        job.wait_until("a durable checkpoint", lambda: CheckpointManager(out / "ckpt").checkpoints(), WAIT)
        survivor = workers(out)["localhost"].pid
        workers(out)["127.0.0.1"].send_signal(signal.SIGKILL)  # below --min-np until its cooldown (4-6 s) ends
        killed = time.time()
        job.wait_until("a step at world size 2 after the kill",
                       lambda: any(r["time"] > killed and r["size"] == 2 for r in progress.rows()), WAIT)
        assert workers(out)["localhost"].pid == survivor, "the survivor was restarted"
        (out / "stop").touch()
        job.finish(WAIT)
    log = job.read_log()
    assert "127.0.0.1[0] exited 137: a new worker takes its slot" in log, log[-3000:]
    assert "Wait timeout" not in log and "every worker of the round failed" not in log, log[-3000:]
    assert not EventLog.read(out / "events.jsonl", event="resume"), "the survivor resumed from a checkpoint"
    assert not run_problems(out), run_problems(out)


def test_a_next_world_with_no_host_of_the_last_one_resumes_from_the_checkpoint(tmp_path):
    job, out, progress = start(tmp_path, min_np=1)
    with job:
        job.wait_until("a durable checkpoint", lambda: CheckpointManager(out / "ckpt").checkpoints(), WAIT)
        workers(out)["127.0.0.1"].send_signal(signal.SIGKILL)  # held out for its cooldown (4-6 s)
        (tmp_path / "hosts").write_text("127.0.0.1:1\n")  # and the survivor's host leaves meanwhile
        killed = time.time()
        job.wait_until("a step on 127.0.0.1 after the kill",
                       lambda: any(r["time"] > killed and r["host"] == "127.0.0.1" for r in progress.rows()), WAIT)
        (out / "stop").touch()
        job.finish(WAIT)
    log = job.read_log()
    assert "no host of the last world is in the next one, so no survivor can hand it the state" in log, log[-3000:]
    assert "stop running" not in log, log[-3000:]
    assert len(EventLog.read(out / "events.jsonl", event="resume")) == 1
    assert not run_problems(out), run_problems(out)


def test_a_rank_0_lost_in_a_relaunched_jobs_first_sync_does_not_restart_training(tmp_path):
    """Not a driver rule: the job's own resume.  Rank 0 loads the newest checkpoint before the first sync;
    when it dies in that sync, the next world's rank 0 must load it too, not broadcast its fresh state."""
    job, out, progress = start(tmp_path, min_np=1)
    with job:
        job.wait_until("a checkpoint past step 6", lambda: max(checkpoint_steps(out), default=0) >= 6, WAIT)
        job.kill()
    saved = max(checkpoint_steps(out))
    relaunched = time.time()
    again = launch(tmp_path, out, min_np=1, args=("--die-in-first-sync", tmp_path / "died"), name="relaunched")
    with again:
        again.wait_until("rank 0 to die in the first sync", lambda: (tmp_path / "died").exists(), WAIT)
        again.wait_until("3 steps after the relaunch",
                         lambda: sum(r["time"] > relaunched for r in progress.rows()) >= 3, WAIT)
        (out / "stop").touch()
        again.finish(WAIT)
    after = [r["step"] for r in progress.rows() if r["time"] > relaunched]
    assert min(after) > saved, f"the relaunched job trained from step {min(after)}, its checkpoint was at {saved}"
    assert not run_problems(out), run_problems(out)


def checkpoint_steps(out: Path) -> list[int]:
    return [json.loads(path.read_text()).get("step", 0) for path in CheckpointManager(out / "ckpt").checkpoints()]


def third_local_host() -> str:
    """A third name horovodrun runs on this machine without ssh: the machine's own host name."""
    name = socket.gethostname()
    address = socket.gethostbyname(name)
    local = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}
    assert name not in ("localhost", "127.0.0.1") and address in local, \
        f"this test needs the host name {name!r} to resolve to an address of this machine (got {address})"
    return name


@pytest.mark.parametrize("join_ahead", ["0", "1"])
def test_a_host_lost_while_the_survivors_reinitialise_costs_them_no_state(tmp_path, join_ahead):
    lost = third_local_host()
    # Join-ahead off: the survivors leave their world for the newcomer at once, as in a reset for a failure;
    # on: they train on while asking, and the doomed world sends them back to asking at once.
    job, out, progress = start(tmp_path, min_np=2, max_np=3, args=("--fail-on-host", lost),
                               HVD_ELASTIC_JOIN_AHEAD=join_ahead)
    with job:
        job.wait_until("a durable checkpoint", lambda: CheckpointManager(out / "ckpt").checkpoints(), WAIT)
        survivors = {host: proc.pid for host, proc in workers(out).items()}
        (tmp_path / "hosts").write_text(BOTH + f"{lost}:1\n")
        job.wait_until(f"{lost}'s worker to end before hvd.init()", lambda: "exit with status code 3" in job.read_log(),
                       WAIT)
        (tmp_path / "hosts").write_text(BOTH)  # the host is gone for good
        ended = time.time()
        job.wait_until("a step at world size 2 after the loss",
                       lambda: any(r["time"] > ended and r["size"] == 2 for r in progress.rows()), WAIT)
        assert {host: proc.pid for host, proc in workers(out).items()} == survivors, "a survivor was restarted"
        (out / "stop").touch()
        job.finish(WAIT)
    log = job.read_log()
    assert "exited 3: this world cannot form any more" in log, log[-3000:]
    if join_ahead == "1":  # rank 0 left the question at once, not after Gloo's rendezvous timeout
        assert "join ahead: the new world cannot form" in log, log[-3000:]
    assert "Wait timeout" not in log and "every worker of the round failed" not in log, log[-3000:]
    assert not EventLog.read(out / "events.jsonl", event="resume"), "the survivors resumed from a checkpoint"
    assert not run_problems(out), run_problems(out)


def test_a_worker_stuck_in_a_given_up_worlds_rendezvous_is_ended(tmp_path):
    out = tmp_path / "job"
    out.mkdir()
    job = launch(tmp_path, out, min_np=2, args=("--hang-before-init-on", "127.0.0.1"))
    with job:
        job.wait_until("127.0.0.1's worker to hang and localhost's to start",
                       lambda: (out / "hung-127.0.0.1").exists() and "localhost" in workers(out), WAIT)
        workers(out)["localhost"].send_signal(signal.SIGKILL)  # the world is given up
        progress = JsonLines(out / "progress.jsonl")
        job.wait_until("a step at world size 2", lambda: any(r["size"] == 2 for r in progress.rows()), WAIT)
        (out / "stop").touch()
        job.finish(WAIT)
    log = job.read_log()
    assert "hvd-elastic: 127.0.0.1[0] is still inside the given-up world's rendezvous 5 s later: ending it" in log, \
        log[-3000:]
    assert "every worker of the round failed" in log and "stop running" not in log, log[-3000:]
    assert not run_problems(out), run_problems(out)


def gloo_addresses(size: int, port: int) -> bytes:
    """A rank's block of Gloo addresses in a world of ``size`` (gloo/transport/tcp/address.h: a sockaddr_storage
    and a sequence number per peer), every one 127.0.0.1:``port``."""
    sockaddr = struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) + socket.inet_aton("127.0.0.1")
    one = sockaddr.ljust(128, b"\0") + struct.pack("=q", 0)
    return one * (size - 1)


def test_survivors_stuck_connecting_in_a_given_up_world_leave_it_without_waiting_for_gloo(tmp_path):
    joiner = third_local_host()
    job, out, progress = start(tmp_path, min_np=2, max_np=3, args=("--hang-before-init-on", joiner))
    silent = socket.socket()  # accepts connections into its backlog and never answers: a host gone mid-connect
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    with job, silent:
        job.wait_until("a durable checkpoint", lambda: CheckpointManager(out / "ckpt").checkpoints(), WAIT)
        env = next(iter(workers(out).values())).environ()
        server = Server(env["HOROVOD_GLOO_RENDEZVOUS_ADDR"], int(env["HOROVOD_GLOO_RENDEZVOUS_PORT"]))
        (tmp_path / "hosts").write_text(BOTH + f"{joiner}:1\n")
        job.wait_until("the joiner to start", lambda: (out / f"hung-{joiner}").exists(), WAIT)
        job.wait_until("the world of 3", lambda: joiner in getattr(server.world(), "hosts", ()), WAIT)
        rank = server.world().hosts.index(joiner)
        assert server.request("PUT", f"/global/{rank}", gloo_addresses(3, silent.getsockname()[1]))[0] == 200
        job.wait_until("the survivors in the world of 3", lambda: server.world().present == {0, 1, 2}, WAIT)
        time.sleep(2)  # they enter hvd.init() and connect into the silent socket
        (tmp_path / "hosts").write_text(BOTH)
        workers(out)[joiner].send_signal(signal.SIGKILL)  # the driver gives the world up
        killed = time.time()
        job.wait_until("a step at world size 2 after the loss",
                       lambda: any(r["time"] > killed and r["size"] == 2 for r in progress.rows()), WAIT)
        (out / "stop").touch()
        job.finish(WAIT)
    log = job.read_log()
    assert log.count("exit with status code 75") == 2, log[-3000:]
    assert log.count("leaving hvd.init(), whose connections cannot complete") == 2, log[-3000:]
    assert "every worker of the round failed" in log and "stop running" not in log, log[-3000:]
    assert not run_problems(out), run_problems(out)


def test_a_job_that_finishes_while_a_host_joins_ends_with_success(tmp_path):
    out = tmp_path / "job"
    out.mkdir()
    job = launch(tmp_path, out, np=1, min_np=1, hosts="localhost:1\n", args=("--hang-before-init-on", "127.0.0.1"))
    with job:
        progress = JsonLines(out / "progress.jsonl")
        job.wait_until("4 steps at world size 1", lambda: sum(r["size"] == 1 for r in progress.rows()) >= 4, WAIT)
        (tmp_path / "hosts").write_text(BOTH)  # 127.0.0.1 joins; its worker never gets through hvd.init()
        job.wait_until("the joiner to start", lambda: (out / "hung-127.0.0.1").exists(), WAIT)
        (out / "stop").touch()  # the survivor trains on (join-ahead) and finishes at the epoch's end
        assert job.wait(timeout=WAIT) == 0, job.log_tail()
    log = job.read_log()
    assert "hvd-elastic: the job finished while 127.0.0.1[0] was joining: ending it" in log, log[-3000:]
    assert not run_problems(out), run_problems(out)
