"""Checkpoint storage every host sees, on netns hosts reached over real ssh (issue 20).

The per-host directory is real: :meth:`NetnsBed.host_local_dir` mounts an empty tmpfs over the
same path inside each host's mount namespace (where its sshd, and so every worker horovodrun
starts there, lives), so the path names a different, host-local directory on each host, as
node-local disks do.  Required:

* an elastic job with its ``checkpoint_dir`` there stops before training, on every rank, with one
  line naming the directory and each host that does not see rank 0's marker;
* ``hvd-elastic doctor --hosts`` on the launcher fails a ``shared`` line for each host on that
  directory, and passes every host on a directory they all share (the positive control: the
  same ssh path works when the storage is shared).

The passing side of the job's check over ssh is exercised by every fault-matrix job (their
checkpoints are in the shared output folder, hosts join and leave).
"""

from __future__ import annotations

import pytest

from testbed import HVD_ELASTIC, child_env
from testbed.multihost import ElasticCluster
from testbed.netns import LAUNCHER

pytestmark = [pytest.mark.slow, pytest.mark.multihost]

HOSTS = ["hvdtb1", "hvdtb2"]
REFUSAL = "SharedDirError: checkpoint_dir"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ElasticCluster(tmp_path_factory.mktemp("shared-dir"), hosts=2, ttl=3.0) as c:
        c.wait_discovered([f"{h}:1" for h in HOSTS])
        local = c.workdir / "node-local"
        for host in HOSTS:
            c.bed.host_local_dir(host, local)
        yield c


def doctor(cluster: ElasticCluster, directory) -> tuple[int, list[str], str]:
    """``hvd-elastic doctor --hosts`` on the launcher, reaching the hosts with the bed's ssh: (exit, shared lines,
    stderr)."""
    env = cluster.bed.env(child_env(CONSUL_HTTP_ADDR=cluster.consul_addr(LAUNCHER), **cluster.consul_env))
    out = cluster.bed.run(LAUNCHER, [HVD_ELASTIC, "doctor", "--checkpoint-dir", directory, "--min-free-gib", "0",
                                     "--hosts", ",".join(HOSTS)], env=env, timeout=300)
    return out.returncode, [line for line in out.stdout.splitlines() if line.split()[1] == "shared"], out.stderr


def test_a_job_on_a_per_host_directory_is_refused_naming_the_hosts(cluster):
    local = cluster.workdir / "node-local"
    job = cluster.start_job(2, 2, 2, "--checkpoint-dir", str(local), name="per-host")
    code = job.wait(timeout=240)
    log = job.read_log()
    lines = [line for line in log.splitlines() if REFUSAL in line]
    assert code != 0, log[-4000:]
    assert {line[:3] for line in lines} == {"[0]", "[1]"}, log[-4000:]  # every rank stopped, none hangs
    message = lines[0].split("SharedDirError: ", 1)[1]
    assert message.startswith(f"checkpoint_dir {local} is not shared by every host"), message
    rank0 = next(h for h in HOSTS if f"rank 0 wrote there on {h} is not seen" in message)
    others = [h for h in HOSTS if h != rank0]
    assert f"is not seen on {', '.join(f'{h} (rank 1)' for h in others)} (no such file)" in message, message
    assert "HVD_ELASTIC_CHECKPOINT_LOCAL=1" in message
    assert not (job.out / "progress.jsonl").exists(), "a step was trained before the refusal"
    assert not list((job.out / "pids").glob("*.json")), "the training function was entered"


def test_doctor_fails_each_host_on_a_per_host_directory_and_passes_a_shared_one(cluster):
    local = cluster.workdir / "node-local"
    code, shared, stderr = doctor(cluster, local)
    assert code == 1, (shared, stderr)
    assert [line.split()[:3] for line in shared] == [["FAIL", "shared", h] for h in HOSTS], shared
    assert all(f"does not see {local}: the marker written here is not there (cat: " in line and "fix:" in line
               for line in shared), shared
    assert stderr.strip().endswith("failed: shared"), stderr
    assert list(local.iterdir()) == []  # doctor removed its marker

    common = cluster.workdir / "common"
    common.mkdir()
    code, shared, stderr = doctor(cluster, common)
    assert shared == [f"ok    shared     {h} sees {common}" for h in HOSTS], (shared, stderr)
    assert code == 0, stderr
