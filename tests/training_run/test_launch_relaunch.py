"""``hvd-elastic launch`` on a real job: Horovod ends it when every worker of a round fails, launch resumes it.

The chaos soak met this on the bed (a few times in every hundred overlapping faults): a
host lost during a rendezvous makes the survivors still inside ``hvd.init()``
abort, every worker of the round fails, and horovodrun exits ("failure count
== N -> stop running", horovod/horovod#3264).  Here the same rule of Horovod's
is met directly: elastic horovodrun on two local hosts (``localhost``,
``127.0.0.1``, host-file discovery) trains :mod:`testbed.worker`,
both workers are SIGKILLed at once, and the job must come back under
``hvd-elastic launch`` from its newest durable checkpoint and end with the
fault matrix's verdict (:func:`hvd_elastic.report.ledger.run_problems`).
"""

from __future__ import annotations

import signal
import sys
import time

import psutil
import pytest

from testbed import HVD_ELASTIC, JsonLines, Job, child_env, horovodrun_elastic, host_file_discovery
from hvd_elastic.report.ledger import run_problems
from hvd_elastic.training.checkpoint import CheckpointManager
from hvd_elastic.training.events import EventLog

pytestmark = pytest.mark.slow

WAIT = 240.0  # hang guards, not speed bounds


def workers(out) -> list[psutil.Process]:
    """The job's training processes (not the shells Horovod starts them through)."""
    found = []
    for proc in psutil.process_iter(["cmdline"], ad_value=None):
        cmd = proc.info["cmdline"] or []
        if cmd[1:3] == ["-m", "testbed.worker"] and str(out) in cmd:
            found.append(proc)
    return found


def test_a_round_in_which_every_worker_fails_is_relaunched_and_resumes(tmp_path):
    out = tmp_path / "job"
    discovery = host_file_discovery(tmp_path / "hosts", "localhost:1\n127.0.0.1:1\n")
    cmd = [HVD_ELASTIC, "launch", "--max-restarts", "2", "--restart-delay", "0", "--",
           *horovodrun_elastic(discovery, 2, 2, 2), sys.executable, "-m", "testbed.worker",
           "--out", out, "--samples", "96", "--checkpoint-every", "3"]
    out.mkdir()
    progress = JsonLines(out / "progress.jsonl")
    with Job(cmd, env=child_env(HOROVOD_GLOO_TIMEOUT_SECONDS="60"), logdir=tmp_path, name="launch") as job:
        job.start()
        job.wait_until("8 steps at world size 2", lambda: sum(r["size"] == 2 for r in progress.rows()) >= 8, WAIT)
        job.wait_until("a durable checkpoint", lambda: CheckpointManager(out / "ckpt").checkpoints(), WAIT)
        victims = job.wait_until("both workers", lambda: len(workers(out)) == 2 and workers(out), WAIT)
        for proc in victims:
            proc.send_signal(signal.SIGKILL)
        killed = time.time()
        job.wait_until("hvd-elastic launch to relaunch the job", lambda: "relaunch 1 of 2" in job.read_log(), WAIT)
        job.wait_until("a step after the relaunch", lambda: any(r["time"] > killed for r in progress.rows()), WAIT)
        (out / "stop").touch()
        job.finish(WAIT)
    log = job.read_log()
    assert "failure count == 2 -> stop running" in log, log[-3000:]
    assert "exited with 1 (ERROR:root:failure count == 2 -> stop running); relaunch 1 of 2" in log, log[-3000:]
    assert not run_problems(out), run_problems(out)
    resumes = EventLog.read(out / "events.jsonl", event="resume")
    assert len(resumes) == 1 and resumes[0]["step"] >= 3, resumes
