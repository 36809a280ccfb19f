"""A join through the warm standby under real elastic horovodrun (Gloo, localhost + 127.0.0.1).

Every worker is started as ``hvd-elastic exec -- python -m testbed.worker``
and forked by one standby; a slot joins by a host-file edit.  The job must train
exactly once per epoch with identical state on every rank
(:func:`hvd_elastic.report.ledger.verdict`), as a job of directly started workers does.
"""

from __future__ import annotations

import json
import sys

import psutil
import pytest

from testbed import HVD_ELASTIC, JsonLines, Job, horovodrun_elastic, host_file_discovery, wait_until
from hvd_elastic.report.ledger import verdict
from testbed.standby import StandbyProcess

pytestmark = pytest.mark.slow

WAIT = 240.0  # hang guards, not speed bounds


def test_a_join_through_the_standby_trains_exactly_once_with_identical_parameters(tmp_path):
    out = tmp_path / "job"
    out.mkdir()
    hosts = out / "hosts"
    discover = host_file_discovery(hosts, "localhost:1\n127.0.0.1:1\n")
    with StandbyProcess(tmp_path, "job", "--preload", "psutil,torch.utils.data") as standby:
        standby.wait_ready()
        cmd = [*horovodrun_elastic(discover, 2, 1, 3), HVD_ELASTIC, "exec", "--standby", "job", "--",
               sys.executable, "-m", "testbed.worker", "--out", str(out), "--samples", "96",
               "--step-sleep", "0.05", "--num-workers", "1"]
        env = {**standby.env, "HOROVOD_GLOO_TIMEOUT_SECONDS": "60"}
        progress = JsonLines(out / "progress.jsonl")
        with Job(cmd, logdir=tmp_path, name="horovodrun", env=env) as job:
            job.start()
            wait_until("training at size 2", lambda: any(r["size"] == 2 for r in progress.rows()), WAIT, jobs=[job])
            hosts.write_text("localhost:1\n127.0.0.1:2\n")
            wait_until("10 steps at size 3", lambda: sum(r["size"] == 3 for r in progress.rows()) >= 10, WAIT,
                       jobs=[job])
            workers = [json.loads(p.read_text()) for p in (out / "pids").glob("*.json")]
            parents = {psutil.Process(w["pid"]).ppid() for w in workers if psutil.pid_exists(w["pid"])}
            (out / "stop").touch()
            job.finish(WAIT)
    assert len(workers) == 3 and parents == {standby.proc.pid}, (workers, parents)
    assert "hvd-elastic exec:" not in job.read_log(), "a worker fell back to a direct start"
    result = verdict(out)
    assert result.problems() == [], result
    assert result.params_identical and result.lost == result.duplicated == 0
