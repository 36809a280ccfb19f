"""TrainingState + ExactlyOnceSampler under real elastic horovodrun (Gloo) on localhost + 127.0.0.1.

One job lives through a join, a ``kill -9`` of a worker mid-epoch (its host is
blacklisted briefly, then comes back: a second join) and a graceful leave.
Afterwards every rank holds identical parameters and optimizer state, the
committed ledger shows every sample of every epoch exactly once, and LR
scheduler and GradScaler states agree across ranks.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from testbed import Job, JsonLines, child_env, horovodrun_elastic, host_file_discovery
from hvd_elastic.report.ledger import committed_samples

HERE = Path(__file__).parent
WAIT = 180.0  # seconds the job may take to reach a state: a hang guard, not a speed bound

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # a Gloo timeout of 15 s is a bound on how busy the box may be


class ElasticJob(Job):
    """A horovodrun elastic job whose host set the test rewrites (``hosts_file``)."""

    def __init__(self, out: Path, hosts: str, **env: str):
        self.out = out
        self.hosts_file = out / "hosts"
        discover = host_file_discovery(self.hosts_file, hosts)
        cmd = [*horovodrun_elastic(discover, 2, 1, 4, "--blacklist-cooldown-range", "2", "3"),
               sys.executable, HERE / "elastic_worker.py"]
        super().__init__(cmd, logdir=out, name="horovodrun",
                         env=child_env(OUT=str(out), HOROVOD_GLOO_TIMEOUT_SECONDS="15", HOROVOD_ELASTIC_TIMEOUT="60",
                                       **env))

    def progress(self) -> dict:
        try:
            return json.loads((self.out / "progress.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {"steps": 0, "size": 0}

    def wait_progress(self, what: str, predicate, timeout: float = WAIT) -> dict:
        """The first progress that satisfies ``predicate``; fails if the job exits or time runs out."""

        def satisfied():
            progress = self.progress()
            return progress if predicate(progress) else None

        return self.wait_until(what, satisfied, timeout, interval=0.2)

    def after(self, steps: int, size: int, what: str) -> dict:
        start = self.progress()["steps"]
        return self.wait_progress(what, lambda p: p["size"] == size and p["steps"] >= start + steps)

    def worker_with_rank(self, rank: int, size: int) -> int:
        for path in glob.glob(str(self.out / "pids" / "*.json")):
            info = json.loads(Path(path).read_text())
            pid = int(Path(path).stem)
            if info == {"rank": rank, "size": size} and psutil.pid_exists(pid):
                return pid
        raise AssertionError(f"no live worker with rank {rank} of {size}")


def test_joins_leaves_and_kill9_keep_ranks_identical_and_samples_exactly_once(tmp_path):
    with ElasticJob(tmp_path, "localhost:1\n127.0.0.1:1\n") as job:
        job.start()
        job.after(8, 2, "training in a world of 2")
        job.hosts_file.write_text("localhost:1\n127.0.0.1:2\n")  # a slot joins
        job.after(8, 3, "training in a world of 3 after a join")
        # A crash mid-epoch.  Horovod blacklists the victim's host (ending its
        # other worker too) until the cooldown passes; then the slots rejoin.
        os.kill(job.worker_with_rank(1, 3), signal.SIGKILL)
        job.wait_progress("the crash to shrink the world", lambda p: p["size"] < 3)
        job.after(4, 3, "the killed host's slots to rejoin")
        job.hosts_file.write_text("127.0.0.1:2\n")  # localhost leaves gracefully
        job.after(8, 2, "training in a world of 2 after a leave")
        (tmp_path / "fast").touch()
        assert job.wait(timeout=240) == 0, job.log_tail()

    finals = [json.loads(Path(p).read_text()) for p in sorted(glob.glob(str(tmp_path / "final-*.json")))]
    assert sorted(f["rank"] for f in finals) == list(range(finals[0]["size"])) and len(finals) == 2
    for f in finals[1:]:
        for key in ("checksum", "scheduler", "scaler", "lr"):
            assert f[key] == finals[0][key], f"rank {f['rank']} differs from rank 0 in {key}"

    history = finals[0]["history"]
    assert {2, 3} <= {tuple(k)[2] for k in history}, "the job never ran at both world sizes"
    per_epoch, errors = committed_samples(JsonLines(tmp_path / "ledger" / "*.jsonl").rows(), history)
    assert errors == [] and sorted(per_epoch) == [0, 1]
    for epoch, counts in per_epoch.items():
        assert sorted(counts.elements()) == list(range(finals[0]["samples"])), f"epoch {epoch} is not exactly-once"
    assert finals[0]["scheduler"]["last_epoch"] == len(history)
