"""The four stacks of benchmarks/peers.py on the netns bed, each set up as its own docs recommend.

Every stack runs ``benchmarks/peers_train.py`` (one training process per
host) and offers the same handful of operations, so one fault schedule drives
all four (:class:`Stack`):

``hvd-elastic``
    :class:`~testbed.multihost.ElasticCluster`: HashiCorp Consul, a node agent
    and a warm standby per host, ``horovodrun`` with ``consul_hosts`` over ssh
    from the launcher, workers through ``hvd-elastic exec``.  Leave: a drain.
``horovod``
    Stock Horovod elastic: ``horovodrun`` with a host-file discovery script
    over ssh (``HVD_ELASTIC_DRIVER=0``), the file rewritten as hosts come and
    go.  Leave: the host leaves the file.
``torchrun``
    One ``torchrun --nnodes 1:MAX --rdzv-backend c10d --max-restarts N`` agent
    per host, started on the host as a scheduler would; the c10d store on the
    launcher (``--rdzv-endpoint`` there), so no training host holds it.
    Leave: SIGTERM to the host's agent.
``torchft``
    The Lighthouse on the launcher (torchft's README flags), one replica group
    per host: ``torchrun --nnodes 1 --max-restarts N`` with
    ``REPLICA_GROUP_ID``.  Leave: SIGTERM to the group's torchrun.

:meth:`Stack.revive` restarts what a host's boot would (node agent and
standby; a torchrun agent) after a crash; a frozen or partitioned host keeps
its processes.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import tempfile
import time
from collections.abc import Collection
from pathlib import Path

import psutil

from hvd_elastic.local.job import Job, horovodrun_elastic

from .env import REPO, VENV_BIN, child_env
from .job import host_file_discovery
from .multihost import ElasticCluster
from .netns import LAUNCHER, NetnsBed

TRAIN = REPO / "benchmarks" / "peers_train.py"
PEERS_SITE = VENV_BIN.parent / "peers"  # torchft and its dependencies (scripts/bootstrap.sh, step 5b)
STACKS = ("hvd-elastic", "horovod", "horovod-tuned", "torchrun", "torchft")
C10D_PORT, LIGHTHOUSE_PORT, GROUP_PORT = 29400, 29510, 29600
MAX_RESTARTS = 100  # torchrun counts every membership change as a restart


class Stack:
    """One stack's job on ``hosts`` fresh netns hosts; a context manager that tears everything down."""

    name = ""

    def __init__(self, workdir: Path, hosts: int, train_args: tuple[str, ...] = ()):
        self.workdir = Path(workdir)
        self.initial = hosts
        self.train_args = tuple(map(str, train_args))
        self.out = self.workdir / "out"
        self.jobs: list[Job] = []  # everything started, torn down last-first
        self.launchers: dict[str, Job] = {}  # what runs the training: horovodrun, or each host's torchrun
        self.bed: NetnsBed | None = None
        self.launches = 0

    # -- what every stack provides ----------------------------------------------------------------------

    def __enter__(self) -> Stack:
        self.out.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, *exc_info) -> None:
        for job in reversed(self.jobs):
            job.kill()

    def launch(self, out: Collection[str] = ()) -> None:
        """Start the job (again, after a whole-job loss: each stack resumes as it can).

        ``out``: hosts crashed, cut off or gone for now; their return brings them in.
        """
        raise NotImplementedError

    def running(self) -> bool:
        return any(job.running() for job in self.launchers.values())

    def leave(self, host: str) -> None:
        """The stack's documented graceful way for a host to leave."""
        raise NotImplementedError

    def revive(self, host: str) -> None:
        """A crashed host booted again: start what its boot starts for this stack."""

    def rejoin(self, host: str) -> None:
        """A host that left gracefully comes back."""
        self.revive(host)

    def join(self) -> str:
        """A new host joins the job; its name."""
        raise NotImplementedError

    def hosts(self) -> list[str]:
        return list(self.bed.hosts)

    def trainer(self, host: str) -> list[int]:
        """The pids of ``host``'s training processes."""
        return [p.pid for p in self.bed.processes(host, str(TRAIN)) if "torchrun" not in " ".join(p.cmdline()[:2])]

    def wait(self, timeout: float) -> int | None:
        """Wait for the job to end; its worst exit code (None: still running after ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.5)
        if self.running():
            return None
        return max((job.returncode for job in self.launchers.values()), key=abs, default=0)

    def _start(self, cmd: list[str], env: dict[str, str], name: str) -> Job:
        job = Job(cmd, env=env, logdir=self.workdir / "logs", name=name)
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.jobs.append(job)
        return job.start()

    def _train(self, stack: str) -> list[str]:
        return [str(VENV_BIN / "python"), str(TRAIN), "--stack", stack, "--out", str(self.out), *self.train_args]


# -- Horovod's two ---------------------------------------------------------------------------------------------


class HvdElastic(Stack):
    name = "hvd-elastic"

    def __enter__(self) -> Stack:
        super().__enter__()
        # Horovod's default Gloo timeout (30 s), as a user who sets nothing gets it.
        self.cluster = ElasticCluster(self.workdir / "cluster", self.initial, consul="consul", standby="peers",
                                      gloo_timeout=30)
        # A Unix socket's path holds 107 bytes: the standbys' directory under a short one, as /run/user is.
        self._run_dir = tempfile.mkdtemp(prefix="hvdpe-")
        self.cluster.standby_dir = Path(self._run_dir) / "hvd-elastic"
        self.cluster.__enter__()
        self.bed = self.cluster.bed
        return self

    def __exit__(self, *exc_info) -> None:
        super().__exit__(*exc_info)
        self.cluster.close()
        shutil.rmtree(self._run_dir, ignore_errors=True)

    def launch(self, out: Collection[str] = ()) -> None:
        self.launches += 1  # discovery keeps the hosts that are out away
        through = [str(VENV_BIN / "hvd-elastic"), "exec", "--standby", self.cluster.standby, "--"]
        discovery = f"{VENV_BIN / 'consul_hosts'} --http-addr {self.cluster.consul_addr()}"
        np = len(self.cluster.bed.hosts)
        cmd = horovodrun_elastic(discovery, np, 1, 64, "--network-interface", "eth0", *through,
                                 *self._train(self.name))
        self.launchers = {LAUNCHER: self._start(self.bed.on(LAUNCHER, cmd), self.cluster.job_env(self.out),
                                                f"horovodrun.{self.launches}")}

    def leave(self, host: str) -> None:
        self.cluster.drain(host)

    def rejoin(self, host: str) -> None:
        self.cluster.undrain(host)

    def revive(self, host: str) -> None:
        self.cluster.start_agent(host)  # its Consul agent and standby first, as the host's boot would

    def trainer(self, host: str) -> list[int]:
        standby = self.cluster.standbys.get(host)  # workers are forked by the host's standby
        if standby is None or not standby.running():
            return []
        with contextlib.suppress(psutil.Error):
            return [child.pid for child in psutil.Process(standby.pid).children()]
        return []

    def join(self) -> str:
        return self.cluster.add_host()


class Horovod(Stack):
    name = "horovod"
    tuning: tuple[str, ...] = ()  # horovodrun's defaults

    def __enter__(self) -> Stack:
        super().__enter__()
        self.bed = NetnsBed(self.workdir / "bed", self.initial, ssh_keepalive=False)
        self.bed.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        super().__exit__(*exc_info)
        self.bed.close()

    def _write_hosts(self, hosts: list[str]) -> Path:
        return host_file_discovery(self.out / "hosts", "".join(f"{h}:1\n" for h in hosts))

    def launch(self, out: Collection[str] = ()) -> None:
        self.launches += 1
        discovery = self._write_hosts([h for h in self.hosts() if h not in out])
        cmd = horovodrun_elastic(str(discovery), len(self.hosts()), 1, 64, "--network-interface", "eth0",
                                 *self.tuning, *self._train("horovod"))
        env = self.bed.env(child_env(HVD_ELASTIC_DRIVER="0"))
        self.launchers = {LAUNCHER: self._start(self.bed.on(LAUNCHER, cmd), env, f"horovodrun.{self.launches}")}

    def leave(self, host: str) -> None:
        self._write_hosts([h for h in self._listed() if h != host])

    def revive(self, host: str) -> None:
        pass  # sshd is the bed's: a booted host is reachable again (stock Horovod keeps it blacklisted)

    def rejoin(self, host: str) -> None:
        self._write_hosts([*self._listed(), host])

    def join(self) -> str:
        host = self.bed.add_host().name
        self._write_hosts([*self._listed(), host])
        return host

    def _listed(self) -> list[str]:
        return [line.split(":")[0] for line in (self.out / "hosts").read_text().split()]


class HorovodTuned(Horovod):
    """Stock Horovod with the blacklist cooldown its elastic docs show: by default a host that failed
    once stays out for the rest of the job, so a crashed or frozen host never comes back."""

    name = "horovod-tuned"
    tuning = ("--blacklist-cooldown-range", "10", "100")


# -- PyTorch's two ---------------------------------------------------------------------------------------------


class _PerHost(Stack):
    """A stack with one launcher process per host, started on the host itself."""

    def __enter__(self) -> Stack:
        super().__enter__()
        self.bed = NetnsBed(self.workdir / "bed", self.initial)
        self.bed.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        super().__exit__(*exc_info)
        self.bed.close()

    def launch(self, out: Collection[str] = ()) -> None:
        self.launches += 1
        for host in self.hosts():
            if host not in out:
                self.revive(host)

    def leave(self, host: str) -> None:
        self.launchers[host].signal(signal.SIGTERM)

    def join(self) -> str:
        host = self.bed.add_host().name
        self.revive(host)
        return host


class Torchrun(_PerHost):
    name = "torchrun"

    def __enter__(self) -> Stack:
        super().__enter__()
        # The c10d store, hosted on the launcher (a node no fault touches, as --rdzv-endpoint recommends a
        # stable one): a TCPStore server, which the agents reach as clients.
        store = ("import time, datetime, torch.distributed as d; "
                 f"s = d.TCPStore('0.0.0.0', {C10D_PORT}, is_master=True, wait_for_workers=False, "
                 "timeout=datetime.timedelta(hours=24)); time.sleep(10**9)")
        self._start(self.bed.on(LAUNCHER, [VENV_BIN / "python", "-c", store]), child_env(), "c10d-store")
        return self

    def revive(self, host: str) -> None:
        # An agent that fails shuts its rendezvous down for good: each launch is a new one, as a
        # scheduler's next attempt of the job would be.
        cmd = [VENV_BIN / "torchrun", "--nnodes", f"1:{len(self.hosts()) + 4}", "--nproc-per-node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{self.bed.launcher.address}:{C10D_PORT}",
               "--rdzv-id", f"peers{self.launches}", "--rdzv-conf", "is_host=false",
               "--max-restarts", str(MAX_RESTARTS), "--local-addr", self.bed.hosts[host].address,
               *self._train(self.name)[1:]]
        self.launchers[host] = self._start(self.bed.on(host, cmd), child_env(PEERS_HOST=host),
                                        f"torchrun.{host}.{self.launches}")


class Torchft(_PerHost):
    name = "torchft"

    def __enter__(self) -> Stack:
        super().__enter__()
        lighthouse = [VENV_BIN / "python", PEERS_SITE / "bin" / "torchft_lighthouse", "--min_replicas", "1",
                      "--quorum_tick_ms", "100", "--join_timeout_ms", "10000",
                      "--bind", f"[::]:{LIGHTHOUSE_PORT}"]
        self._start(self.bed.on(LAUNCHER, lighthouse), child_env(PYTHONPATH=str(PEERS_SITE)), "lighthouse")
        self.groups: dict[str, int] = {}
        return self

    def revive(self, host: str) -> None:
        if host not in self.groups:  # a new host takes the id (and shard) of a group no live host holds
            held = {self.groups[h] for h, job in self.launchers.items() if job.running()}
            self.groups[host] = min(set(range(len(self.groups) + 1)) - held)
        group = self.groups[host]
        address = self.bed.hosts[host].address
        cmd = [VENV_BIN / "torchrun", "--nnodes", "1", "--nproc-per-node", "1", "--master-addr", address,
               "--master-port", str(GROUP_PORT), "--max-restarts", str(MAX_RESTARTS), *self._train(self.name)[1:],
               "--groups", str(self.initial)]
        env = child_env(PYTHONPATH=f"{REPO}:{PEERS_SITE}", REPLICA_GROUP_ID=str(group), PEERS_HOST=host,
                        NUM_REPLICA_GROUPS=str(self.initial), PEERS_ADDR=address, PEERS_LAUNCH=str(self.launches),
                        TORCHFT_LIGHTHOUSE=f"http://{self.bed.launcher.address}:{LIGHTHOUSE_PORT}")
        self.launchers[host] = self._start(self.bed.on(host, cmd), env, f"torchft.{host}.{self.launches}")


def make(name: str, workdir: Path, hosts: int, train_args: tuple[str, ...] = ()) -> Stack:
    """The stack called ``name`` (one of :data:`STACKS`)."""
    classes = {cls.name: cls for cls in (HvdElastic, Horovod, HorovodTuned, Torchrun, Torchft)}
    if name not in classes:
        raise ValueError(f"unknown stack {name!r}: expected one of {', '.join(STACKS)}")
    return classes[name](workdir, hosts, train_args)

