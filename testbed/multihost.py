"""An elastic job on real hosts: the netns bed + Consul + node agents + horovodrun over ssh.

:class:`ElasticCluster` is what the fault matrix and the recovery benchmark use::

    with ElasticCluster(tmp_path, hosts=3) as cluster:
        job = cluster.start_job(np=3, min_np=2, max_np=3)
        cluster.wait_steps(job, size=3, steps=5)
        cluster.bed.partition("hvdtb2")
        ...

Consul is HashiCorp's by default (``consul="consul"``), laid out as in
production: one server agent in the root namespace, bound to the bed's bridge
address (``consul_servers=3``: a Raft quorum of three there, each with ports of
its own), and a client agent inside every host's namespace (the launcher's
included, where discovery asks), joined to it by gossip over the bed's
network; so a partitioned or frozen host is also marked critical by
``serfHealth``, and a host that crashes loses its agent.  ``consul="dev"`` is
the dev agent instead, in this process on the bridge address, one Consul node
per host (and spares for hosts added later).  Each test host runs
``hvd-elastic node-agent`` inside its namespace against its own node's agent.  The job runs on the
launcher host: ``horovodrun`` with ``discovery/consul_hosts`` (or a plain host
file, for baselines), reaching every host over ssh, training
:mod:`testbed.worker`.  Every process it starts dies with it.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import psutil

from hvd_elastic.devagent import DevCluster
from hvd_elastic.local.job import Job, horovodrun_elastic
from hvd_elastic.local.realconsul import ConsulCluster
from hvd_elastic.report.jsonlines import JsonLines

from .env import CONSUL_HOSTS, HVD_ELASTIC, VENV_BIN, child_env
from .job import host_file_discovery
from .netns import LAUNCHER, PREFIX, NetnsBed

SPARE_HOSTS = 2  # Consul nodes made ready for hosts a test adds mid-run


class TrainingJob(Job):
    """A horovodrun of :mod:`.worker` whose evidence lands in ``out`` (read incrementally through ``progress``)."""

    def __init__(self, out: Path, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.out = out
        self.progress = JsonLines(out / "progress.jsonl")


class ElasticCluster:
    """``hosts`` netns hosts registered in a dev Consul by their node agents; see the module docstring.

    Args:
        workdir: everything the cluster writes (bed keys, logs, job output).
        hosts: test hosts at start (each gets one slot).
        ttl: the node agents' TTL in seconds (a silent node leaves after it).
        gloo_timeout: ``HOROVOD_GLOO_TIMEOUT_SECONDS`` of the job: what a collective
            with a hung or partitioned peer waits before it fails.
        slots: slots each node agent advertises.
        acl_token: turn Consul's ACLs on with this token, which every process the
            cluster starts reads from a file only its owner may read (``consul_env``).
        consul: "consul" (HashiCorp Consul agents, see the module docstring) or "dev".
        consul_servers: how many Consul server agents (``consul="consul"`` only): 1, the ``-dev`` server, or an
            odd number more, a Raft quorum whose leader's loss is an election
            (:class:`~hvd_elastic.local.realconsul.ConsulCluster`).
        node_agents: start a node agent on every host (False: something else registers
            the hosts, e.g. Slurm worker jobs, :mod:`.slurm`).
        ssh_keepalive: horovodrun's ssh with keep-alives (ends a lost host's session in
            about 6 s); False is OpenSSH's default client configuration (none).
        standby: every host runs ``hvd-elastic standby --name STANDBY`` (preloading
            ``preload``), its node agent announces it only once that answers
            (``--standby``), and workers start through ``hvd-elastic exec``.  The
            socket directory is host-local on every host, as ``/run/user`` is.
        preload: the standby's ``--preload`` modules.
    """

    def __init__(self, workdir: Path, hosts: int = 3, *, ttl: float = 3.0, gloo_timeout: int = 20, slots: int = 1,
                 acl_token: str | None = None, consul: str = "consul", consul_servers: int = 1,
                 node_agents: bool = True, ssh_keepalive: bool = True, standby: str | None = None, preload: str = ""):
        if consul not in ("consul", "dev"):
            raise ValueError(f"consul must be 'consul' or 'dev', got {consul!r}")
        if consul == "dev" and consul_servers != 1:
            raise ValueError(f"consul_servers={consul_servers!r} needs consul='consul' (the dev agent is one process)")
        self.consul_kind = consul
        self.consul_servers = consul_servers
        self.with_node_agents = node_agents
        self.workdir = Path(workdir)
        self.slots = slots
        self.ttl = ttl
        self.gloo_timeout = gloo_timeout
        self.bed = NetnsBed(self.workdir / "bed", hosts, ssh_keepalive=ssh_keepalive)
        self.consul: ConsulCluster | DevCluster | None = None
        self.agents: dict[str, Job] = {}
        self.standby, self.preload = standby, preload
        # Under a host-local directory on every host (NetnsBed.host_local_dir), as $XDG_RUNTIME_DIR/hvd-elastic is;
        # the standby makes its own directory 0700 (a tmpfs's root is 1777, which it refuses).
        self.standby_dir = self.workdir / "run" / "hvd-elastic"
        self.standbys: dict[str, Job] = {}
        self.jobs: list[Job] = []
        self._initial = hosts
        self.acl_token = acl_token
        # The Consul settings of every process the cluster starts (node agents, operator commands,
        # discovery, the job): the token's FILE, never its value.  A test may replace it before start_job.
        self.consul_env: dict[str, str] = {}

    def __enter__(self) -> "ElasticCluster":
        self.bed.__enter__()
        try:
            nodes = [LAUNCHER, *self.bed.hosts]
            if self.acl_token is not None:
                token_file = self.workdir / "consul-token"
                token_file.touch(mode=0o600)
                token_file.write_text(self.acl_token)
                self.consul_env = {"CONSUL_HTTP_TOKEN_FILE": str(token_file)}
            if self.consul_kind == "consul":
                # A host added later gets its agent then (start_agent), as a booting machine would.
                self.consul = ConsulCluster(nodes, acl_token=self.acl_token, server_address=self.bed.bridge_address,
                                            placement=self._placement, servers=self.consul_servers).start()
            else:  # the dev agent's nodes are fixed at start: spares for hosts added later
                spares = [f"{PREFIX}{i}" for i in range(self._initial + 1, self._initial + SPARE_HOSTS + 1)]
                self.consul = DevCluster(nodes=[*nodes, *spares], bind=self.bed.bridge_address,
                                         acl_token=self.acl_token).start()
            for host in self.bed.hosts if self.with_node_agents else ():
                self.start_agent(host)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        try:
            for job in [*self.jobs, *self.agents.values(), *self.standbys.values()]:
                job.kill()
            if self.consul is not None:
                self.consul.stop()
        finally:
            self.bed.close()

    # -- Consul side -------------------------------------------------------------

    def consul_addr(self, node: str = LAUNCHER) -> str:
        return self.consul.addr(node)

    def _placement(self, node: str) -> tuple[str, list[str]]:
        """Where ``node``'s Consul agent runs: its host's address and namespaces."""
        host = self.bed.launcher if node == LAUNCHER else self.bed.hosts[node]
        return host.address, host.enter()

    def ensure_consul_agent(self, host: str) -> None:
        """``host``'s Consul agent runs (started for a new host, restarted after it died)."""
        if isinstance(self.consul, ConsulCluster):
            if host not in self.consul.nodes:
                self.consul.add_node(host)
            elif not self.consul.is_running(host):
                self.consul.start_node(host)

    def start_agent(self, host: str) -> Job:
        """Start (or restart) the node agent of ``host`` inside its namespace (and its Consul agent, if it died;
        with ``standby``, the host's standby first, if it is not running)."""
        if host in self.agents:
            self.agents[host].kill()
        self.ensure_consul_agent(host)
        if self.standby and not (host in self.standbys and self.standbys[host].running()):
            self.start_standby(host)
        waits = ["--standby", self.standby] if self.standby else []
        job = Job(self.bed.on(host, [HVD_ELASTIC, "--log-level", "INFO", "node-agent",
                                     "--http-addr", self.consul_addr(host),
                                     "--slots", str(self.slots), *self.node_agent_health_arguments(), *waits],
                              mount=bool(self.standby)),
                  env=child_env(**self.consul_env, **self.standby_env()), logdir=self.workdir / "logs",
                  name=f"node-agent.{host}")
        self.agents[host] = job.start()
        return job

    def standby_env(self) -> dict[str, str]:
        return {"HVD_ELASTIC_STANDBY_DIR": str(self.standby_dir)} if self.standby else {}

    def start_standby(self, host: str) -> Job:
        """``hvd-elastic standby`` on ``host``, in its mount namespace, its socket in the host's own directory."""
        if host not in self.standbys:  # a host's directory is made once; a restarted standby reuses it
            self.bed.host_local_dir(host, self.standby_dir.parent)
        preload = ["--preload", self.preload] if self.preload else []
        job = Job(self.bed.on(host, [HVD_ELASTIC, "standby", "--name", self.standby, *preload], mount=True),
                  env=child_env(**self.standby_env()), logdir=self.workdir / "logs", name=f"standby.{host}")
        self.standbys[host] = job.start()
        return job

    def node_agent_health_arguments(self) -> list[str]:
        """The bed's node-agent health settings: its TTL, four updates per TTL, memory probe only (1K free is
        enough)."""
        return ["--ttl", str(self.ttl), "--interval", str(max(self.ttl / 4, 0.2)), "--probe", "memory",
                "--min-free-memory", "1K"]

    def stop_agent(self, host: str) -> None:
        """The node agent dies (SIGKILL): its TTL check expires after ``ttl`` seconds."""
        self.agents[host].kill()

    def hvd_elastic(self, host: str, *args: str) -> None:
        """Run an ``hvd-elastic`` operator command (drain, undrain...) on ``host`` against its own agent."""
        result = self.bed.run(host, [HVD_ELASTIC, *args, "--http-addr", self.consul_addr(host)],
                              env=child_env(**self.consul_env))
        if result.returncode != 0:
            raise RuntimeError(f"hvd-elastic {' '.join(args)} on {host} failed: {result.stderr.strip()}")

    def drain(self, host: str) -> None:
        self.hvd_elastic(host, "drain", "--reason", "test bed")

    def undrain(self, host: str) -> None:
        self.hvd_elastic(host, "undrain")

    def add_host(self) -> str:
        """A new host boots (its Consul agent with it) and, with ``node_agents``, its node agent registers it."""
        host = self.bed.add_host().name
        if self.with_node_agents:
            self.start_agent(host)
        else:
            self.ensure_consul_agent(host)
        return host

    def discovered(self) -> list[str]:
        """What the discovery script prints right now (as horovodrun on the launcher would see it)."""
        result = self.bed.run(LAUNCHER, [CONSUL_HOSTS, "--http-addr", self.consul_addr()],
                              env=child_env(discovery_state=self.workdir / "discovery-probe", **self.consul_env))
        return sorted(result.stdout.split()) if result.returncode == 0 else []

    def wait_discovered(self, expected: list[str], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while (seen := self.discovered()) != sorted(expected):
            if time.monotonic() > deadline:
                raise AssertionError(f"discovery prints {seen}, expected {sorted(expected)}")
            time.sleep(0.3)

    # -- the job -------------------------------------------------------------------

    def start_job(self, np: int, min_np: int, max_np: int, *worker_args: str, host_file: str | None = None,
                  name: str = "job", out: Path | None = None, horovodrun_args: tuple[str, ...] = (),
                  env: dict[str, str] | None = None, max_restarts: int | None = None,
                  stall_timeout: float = 0.0) -> TrainingJob:
        """Elastic horovodrun on the launcher training :mod:`.worker` into ``out`` (default ``workdir/name``).

        ``env``: extra variables for horovodrun and so every worker (an off switch to compare, say).
        ``max_restarts``: run horovodrun under ``hvd-elastic launch --max-restarts N``, which relaunches a
        job that died (:mod:`hvd_elastic.commands.launch`); with ``stall_timeout``, also one whose event log has
        not changed for that many seconds.

        Hosts come from Consul through ``discovery/consul_hosts``, or, with
        ``host_file`` (initial ``host:slots`` lines), from a plain host file the
        caller rewrites at ``<out>/hosts`` (Horovod's own way).
        """
        out = out or self.workdir / name
        out.mkdir(parents=True, exist_ok=True)
        if host_file is not None:
            discovery = str(host_file_discovery(out / "hosts", host_file))
        else:
            discovery = f"{CONSUL_HOSTS} --http-addr {self.consul_addr()}"
        cmd = horovodrun_elastic(discovery, np, min_np, max_np, *self.job_arguments(out, horovodrun_args, worker_args))
        if max_restarts is not None:
            watch = ["--progress-file", str(out / "events.jsonl"), "--stall-timeout", f"{stall_timeout:g}"] \
                if stall_timeout else []
            cmd = [str(HVD_ELASTIC), "launch", "--max-restarts", str(max_restarts), *watch, "--", *cmd]
        job = TrainingJob(out, self.bed.on(LAUNCHER, cmd), env=self.job_env(out, env), logdir=out, name="horovodrun",
                          also_kill=lambda: [p.pid for h in list(self.bed.hosts)
                                             for p in self.bed.processes(h, str(out))])
        self.jobs.append(job)
        return job.start()

    def job_arguments(self, out: Path, horovodrun_args: tuple[str, ...] = (),
                      worker_args: tuple[str, ...] = ()) -> list[str]:
        """horovodrun's arguments after its discovery and sizes: the bed's network, then the training worker
        (through the host's standby, with ``standby``)."""
        through = [str(HVD_ELASTIC), "exec", "--standby", self.standby, "--"] if self.standby else []
        return ["--network-interface", "eth0", *horovodrun_args, *through,
                str(VENV_BIN / "python"), "-m", "testbed.worker", "--out", str(out), *worker_args]

    def job_env(self, out: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of a job's horovodrun (and so of every worker) writing into ``out``; ``extra`` wins."""
        # CONSUL_HTTP_ADDR: where the workers' health cut reads Consul (hvd_elastic.training._internal.health_cut).
        # A GPU node's workers read their own node's agent at the default address; the bed's agents
        # each listen on their host's address, and every host reaches the launcher's.
        settings = {"CONSUL_HTTP_ADDR": self.consul_addr(), "HOROVOD_GLOO_TIMEOUT_SECONDS": str(self.gloo_timeout),
                    "HOROVOD_ELASTIC_TIMEOUT": "120", **self.consul_env, **self.standby_env(), **(extra or {})}
        return self.bed.env(child_env(discovery_state=out / "discovery-state", **settings))

    @staticmethod
    def progress(job: TrainingJob) -> list[dict]:
        return job.progress.rows()

    def wait_steps(self, job: TrainingJob, size: int, steps: int = 1, since: float = 0.0,
                   timeout: float = 180.0) -> dict:
        """Wait for ``steps`` committed steps at world ``size`` after wall time ``since``; the first such row."""
        def ready():
            rows = [r for r in self.progress(job) if r["time"] > since and r["size"] == size]
            return rows[0] if len(rows) >= steps else None
        return job.wait_until(f"{steps} steps at world size {size}", ready, timeout)

    def workers(self, job: TrainingJob) -> list[dict]:
        """The live workers' latest pid records (rank, size, host, pid)."""
        rows = []
        for path in sorted((job.out / "pids").glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                row = json.loads(path.read_text())
                if psutil.pid_exists(row["pid"]):
                    rows.append(row)
        return rows

    def stop(self, job: TrainingJob, timeout: float = 240.0) -> None:
        """Ask the job to end at its next epoch boundary and wait for exit 0."""
        (job.out / "stop").touch()
        job.finish(timeout)
