"""A worker pod's Consul life, with the manifests' exact commands and environment, against the dev agent and Consul.

One Consul agent plays a Kubernetes node's client agent (the Helm chart's DaemonSet) with two worker
pods on it, hvd-worker-0 and hvd-worker-1 of scripts/k8s/statefulset/worker-statefulset.yaml.  Each
pod's node-agent sidecar, its preStop drain and its lift-stale-drain init container run as the
manifest states them, in the environment the kubelet would build (:func:`render_env`), with only
what a test must change: the ConfigMap's Consul port (the test agent's), the token file's path (a
file of the test's), the binaries' folder (this venv's), the memory/disk probes' thresholds and
folder, the standby's socket directory (one per pod, as the pod's emptyDir is, in a short folder of
the test's: a Unix socket's path holds 107 bytes), and, where the test says so, the preStop's
``--wait`` (the manifest's 270 s where it matters).  A "Horovod worker" is a process with
horovodrun's environment markers, which is all ``drain --wait`` looks for
(tests/nodeagent/test_leave.py).  The worker container's standby is :class:`AnsweringStandby`: what
the sidecar's gate asks of it, without its imports (tests/k8s/test_k8s_entrypoint.py runs the real
one).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from hvd_elastic.nodeagent import leave
from hvd_elastic.standby import protocol
from testbed import Job, child_env, wait_until
from testbed.consul import consul_request, refused_address, run_discovery
from hvd_elastic.local.realconsul import consul_cluster
from k8s_manifests import IMAGE_BIN, K8S, Command, Pod, commands, load, pods, render_env

WAIT = 30.0  # a hang guard, not a speed bound
VENV_BIN = str(Path(sys.executable).parent)
STS = next(pod for pod in pods() if pod.where.startswith("statefulset/worker-statefulset.yaml"))
(LAUNCHER,) = [pod for pod in pods() if pod.where.startswith("statefulset/launcher-job.yaml")]


def local(argv: list[str]) -> list[str]:
    """The image's binaries are this venv's."""
    return [arg.replace(IMAGE_BIN, VENV_BIN) for arg in argv]


class PodEnv:
    """Environments and commands of the pods of one Kubernetes node whose Consul client agent is at ``addr``."""

    def __init__(self, addr: str, tmp_path: Path, sockets: Path):
        self.port = addr.rsplit(":", 1)[1]
        self.tmp_path = tmp_path
        self.sockets = sockets
        self.token = tmp_path / "consul-token"
        self.token.write_text("")  # ACLs off on the test agent: the Secret holds an empty token
        self.token.chmod(0o400)

    def env(self, pod: Pod, container: str, name: str = "hvd-worker-0", port: str | None = None) -> dict[str, str]:
        fields = {"metadata.name": name, "metadata.namespace": "default", "status.hostIP": "127.0.0.1",
                  "status.podIP": "127.0.0.1"}
        env = render_env(pod, pod.container(container), fields,
                         {"hvd-elastic-consul": {"CONSUL_AGENT_PORT": port or self.port}})
        assert env["CONSUL_HTTP_TOKEN_FILE"] == "/etc/hvd-elastic/consul-token/token"
        env["CONSUL_HTTP_TOKEN_FILE"] = str(self.token)
        if "HVD_ELASTIC_CHECKPOINT_DIR" in env:  # the disk probe's folder: /checkpoints is the PVC's
            env.update(HVD_ELASTIC_CHECKPOINT_DIR=str(self.tmp_path), HVD_ELASTIC_MIN_FREE_DISK="1K",
                       HVD_ELASTIC_MIN_FREE_MEMORY="1K")
        if protocol.DIR_ENV in env:  # the pod's emptyDir, one per pod
            assert env[protocol.DIR_ENV] == "/run/hvd-elastic/standby"
            env[protocol.DIR_ENV] = str(self.standby_dir(name))
        return child_env(discovery_state=self.tmp_path, **env)

    def standby_dir(self, name: str) -> Path:
        return self.sockets / name / "standby"

    def command(self, container: str, name: str = "hvd-worker-0", *, hook: bool) -> tuple[Command, dict[str, str]]:
        env = self.env(STS, container, name)
        (cmd,) = [c for c in commands(STS, STS.container(container), env)
                  if c.hook == hook and "hvd-elastic" in c.argv[0]]
        return cmd, env

    def discovery(self) -> str:
        return run_discovery(self.env(LAUNCHER, "launcher")).stdout


def pod_names(listing: str) -> set[str]:
    return {line.split(".", 1)[0] for line in listing.splitlines()}


class AnsweringStandby:
    """The worker container's ``hvd-elastic standby`` as the node agent's gate sees it: a socket that greets every
    connection with this code's fingerprint from this network namespace (the pod's, shared by its containers)."""

    def __init__(self, directory: Path, name: str):
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path = directory / f"standby-{name}.sock"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.bind(str(self.path))
        self.sock.listen(8)
        self.sock.settimeout(0.1)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        hello = {"hello": protocol.fingerprint(), "python": sys.executable, "pid": os.getpid(),
                 "netns": protocol.network_namespace()}
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                protocol.send(conn, hello)

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(WAIT)
        self.sock.close()
        self.path.unlink(missing_ok=True)


@pytest.fixture
def sockets():
    """A short folder for the pods' standby sockets (a pytest tmp_path is too long for a Unix socket's address)."""
    with tempfile.TemporaryDirectory(prefix="k8s-", dir="/tmp") as folder:
        yield Path(folder)


@pytest.fixture
def node(consul_kind, tmp_path, sockets):
    with consul_cluster(consul_kind, ["gpu-node-1"]) as cluster:
        yield PodEnv(cluster.addr("gpu-node-1"), tmp_path, sockets)


@pytest.fixture
def sidecars(node, tmp_path):
    """Start the node-agent sidecar of a pod (the manifest's argv and env), by default with its worker container's
    standby answering; all stopped at teardown."""
    jobs: list[Job] = []
    standbys: dict[str, AnsweringStandby] = {}  # by pod name: a pod started again finds its standby there

    def start(name: str, standby: bool = True) -> Job:
        cmd, env = node.command("node-agent", name, hook=False)
        if standby and name not in standbys:
            standbys[name] = AnsweringStandby(node.standby_dir(name), env["HVD_ELASTIC_STANDBY"])
        job = Job(local(cmd.argv), env=env, logdir=tmp_path, name=f"{name}.node-agent.{len(jobs)}").start()
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.kill()
    for standby in standbys.values():
        standby.close()


@pytest.fixture
def fake_worker():
    procs: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        env = child_env(HOROVOD_HOSTNAME="hvd-worker-0.hvd-worker.default.svc", HOROVOD_RANK="0")
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env)
        procs.append(proc)
        wait_until("the worker to be seen", lambda: proc.pid in leave.local_workers(), WAIT)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def run(cmd: Command, env: dict[str, str], *replace: tuple[str, str],
        timeout: float = 120) -> subprocess.CompletedProcess:
    argv = local(cmd.argv)
    for old, new in replace:
        argv[argv.index(old)] = new
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_commands_under_test_are_the_manifests(tmp_path, sockets):
    (sts,) = load(K8S / "statefulset" / "worker-statefulset.yaml")
    hook = sts["spec"]["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    node = PodEnv("127.0.0.1:8500", tmp_path, sockets)
    prestop, env = node.command("worker", "hvd-worker-0", hook=True)
    assert prestop.argv == hook == [f"{IMAGE_BIN}/hvd-elastic", "drain", "--reason", "pod terminating (preStop hook)",
                                    "--wait", "270"]
    assert env["CONSUL_HTTP_ADDR"] == "127.0.0.1:8500" and env["HVD_ELASTIC_SERVICE_ID"] == "hvd-worker-0"
    sidecar, sidecar_env = node.command("node-agent", "hvd-worker-0", hook=False)
    assert sidecar.argv == [f"{IMAGE_BIN}/hvd-elastic", "node-agent", "--standby", "train"]
    assert sidecar_env["HVD_ELASTIC_ADDRESS"] == "hvd-worker-0.hvd-worker.default.svc"
    assert sidecar_env["HVD_ELASTIC_STANDBY_DIR"] == str(sockets / "hvd-worker-0" / "standby")


# A container of its own, as far as processes go: a PID namespace (as the worker container has) with
# a Horovod-looking worker that lives $1 seconds, seen before the hook starts (bounded: 5 s); then
# the hook's argv.  Other jobs on this machine (other tests' Horovod workers) are not in it.
IN_POD = """
HOROVOD_HOSTNAME=hvd-worker-0.hvd-worker.default.svc HOROVOD_RANK=0 "$PYTHON" -c "import time; time.sleep($1)" &
i=0
while ! grep -qa HOROVOD_RANK /proc/$!/environ 2>/dev/null && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done
shift
exec "$@"
"""


def in_pod(argv: list[str], env: dict[str, str], worker_lifetime: float) -> subprocess.CompletedProcess:
    return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", IN_POD, "sh",
                           str(worker_lifetime), *argv], env={**env, "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_prestop_drains_only_its_pod_and_waits_for_the_job_to_leave(node, sidecars):
    sidecars("hvd-worker-0")
    sidecars("hvd-worker-1")
    wait_until("both pods to be listed", lambda: pod_names(node.discovery()) == {"hvd-worker-0", "hvd-worker-1"}, WAIT)
    assert node.discovery() == "hvd-worker-0.hvd-worker.default.svc:1\nhvd-worker-1.hvd-worker.default.svc:1\n"

    prestop, env = node.command("worker", "hvd-worker-0", hook=True)
    argv = local(prestop.argv)
    stuck = in_pod([*argv[:-1], "1"], env, worker_lifetime=300)
    assert stuck.returncode == 3, stuck
    assert "hvd-worker-0: in maintenance (pod terminating (preStop hook))" in stuck.stdout
    assert "waiting up to 1s for 1 Horovod worker(s) to leave" in stuck.stdout
    assert "1 Horovod worker(s) still running after 1s" in stuck.stderr
    # The neighbour on the same Consul agent stays in the job.
    assert node.discovery() == "hvd-worker-1.hvd-worker.default.svc:1\n"

    started = time.monotonic()
    left = in_pod(argv, env, worker_lifetime=3)  # the manifest's hook, --wait 270: the job leaves after ~3 s
    took = time.monotonic() - started
    assert left.returncode == 0, left
    assert "waiting up to 270s for 1 Horovod worker(s) to leave" in left.stdout
    assert left.stdout.endswith("the job has left this node\n")
    assert 2 < took < 60, took
    assert node.discovery() == "hvd-worker-1.hvd-worker.default.svc:1\n"


@pytest.mark.slow
def test_a_stale_drain_is_lifted_by_the_next_pod_of_the_name(node, sidecars):
    agent = sidecars("hvd-worker-0")
    wait_until("the pod to be listed", lambda: pod_names(node.discovery()) == {"hvd-worker-0"}, WAIT)
    prestop, env = node.command("worker", "hvd-worker-0", hook=True)
    assert run(prestop, env, ("270", "0")).returncode == 0
    agent.kill()  # SIGKILLed before it could deregister: the drain stays on the node's agent
    sidecars("hvd-worker-0")  # the next pod of that name registers again...
    wait_until("the new registration", lambda: "hvd-worker-0" in consul_request(
        f"127.0.0.1:{node.port}", "GET", "/v1/agent/services")[1], WAIT)
    time.sleep(1)
    assert node.discovery() == ""  # ...and is still drained

    lift, lift_env = node.command("lift-stale-drain", "hvd-worker-0", hook=False)
    assert lift.argv[1:] == ["undrain", "--service-id", "hvd-worker-0"]
    script = STS.container("lift-stale-drain")["command"]
    result = subprocess.run([*script[:2], script[2].replace(IMAGE_BIN, VENV_BIN)], env=lift_env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "hvd-worker-0: out of maintenance" in result.stdout, result
    wait_until("the pod to be listed again", lambda: pod_names(node.discovery()) == {"hvd-worker-0"}, WAIT)

    # A fresh pod (nothing registered under its name): the init container still succeeds.
    _, fresh_env = node.command("lift-stale-drain", "hvd-worker-7", hook=False)
    fresh = subprocess.run([*script[:2], script[2].replace(IMAGE_BIN, VENV_BIN)], env=fresh_env,
                           capture_output=True, text=True, timeout=120)
    assert fresh.returncode == 0 and "'hvd-worker-7'" in fresh.stderr and "not registered" in fresh.stderr, fresh


def test_prestop_without_consul_fails_at_once_naming_why(tmp_path, sockets, fake_worker):
    fake_worker()  # a job on the pod: a drain that did not happen must not wait for it
    with refused_address() as nobody:
        node = PodEnv(nobody, tmp_path, sockets)
        prestop, env = node.command("worker", "hvd-worker-0", hook=True)
        assert prestop.argv[-2:] == ["--wait", "270"]
        started = time.monotonic()
        result = run(prestop, env, timeout=120)
        took = time.monotonic() - started
    assert result.returncode == 1, result
    assert result.stderr.startswith("hvd-elastic drain: error: "), result.stderr
    assert "reach" in result.stderr and nobody in result.stderr, result.stderr
    assert took < 60, f"took {took:.0f}s: it waited although it drained nothing"


@pytest.mark.slow
def test_the_sidecar_withholds_its_pod_until_the_worker_containers_standby_answers(node, sidecars):
    agent = sidecars("hvd-worker-0", standby=False)
    wait_until("the sidecar to say it waits", lambda: "standby train not ready yet" in agent.read_log(), WAIT,
               jobs=[agent])
    assert node.discovery() == ""  # registered, withheld: the manifest's wait is 120 s
    _, env = node.command("node-agent", "hvd-worker-0", hook=False)
    standby = AnsweringStandby(node.standby_dir("hvd-worker-0"), env["HVD_ELASTIC_STANDBY"])
    try:
        wait_until("the pod to be listed", lambda: node.discovery() == "hvd-worker-0.hvd-worker.default.svc:1\n",
                   WAIT, jobs=[agent])
    finally:
        standby.close()
