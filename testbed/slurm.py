"""A real Slurm cluster on the netns bed: ``munged``, ``slurmctld`` and one ``slurmd`` per host.

:class:`SlurmCluster` runs Debian's Slurm daemons (22.05, installed by
``scripts/bootstrap.sh``) around an :class:`~.multihost.ElasticCluster`
started without node agents, so that, as on a real cluster, a node is in the
training job only while a Slurm worker allocation holds it::

    with SlurmCluster(tmp_path, hosts=3) as slurm:
        launcher = slurm.submit_launcher(np=2, min_np=1, max_np=3)
        slurm.submit_worker("hvdtb1"); slurm.submit_worker("hvdtb2")
        slurm.elastic.wait_steps(launcher, size=2, steps=5)

Layout: ``munged`` (as user munge, with its own key and socket under
``/run``) and ``slurmctld`` run in the root namespace, the controller on the
bed's bridge address; every bed host (the launcher ``hvdtb0`` included) runs
``slurmd -N <host>`` inside its namespaces, so its node name is its host name
and its address its own.  Each node has one CPU: one worker allocation fills
it.  The jobs are ``scripts/slurm/launcher.sbatch`` and
``scripts/slurm/worker.sbatch``, exactly as shipped, submitted with
``sbatch`` (``SLURM_CONF`` names this cluster's configuration).

Everything is torn down on exit, also after a failed start.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

from hvd_elastic.local import ports
from hvd_elastic.local.job import JobError, wait_until
from hvd_elastic.report.jsonlines import JsonLines

from .env import REPO, VENV_BIN
from .multihost import ElasticCluster
from .netns import LAUNCHER, PREFIX

SCRIPTS = REPO / "scripts" / "slurm"
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "mungekey")
SPARE_NODES = 2  # node names declared for hosts a test adds mid-run
KILL_WAIT = 30  # slurm.conf KillWait: seconds from a job's SIGTERM to its SIGKILL (Slurm's default)


def unavailable_reason() -> str | None:
    """Why Slurm cannot run here (None: it can)."""
    missing = [name for name in DAEMONS if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]
    if missing:
        return (f"Slurm/munge programs missing: {', '.join(missing)} "
                "(scripts/bootstrap.sh installs munge, slurmctld, slurmd, slurm-client)")
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "no user 'munge' (the munge package creates it)"
    return None


def _exe(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class SlurmJob:
    """A submitted Slurm job; for the launcher, also where its training writes (``out``, ``progress``)."""

    def __init__(self, slurm: "SlurmCluster", job_id: str, name: str, out: Path | None = None):
        self.slurm, self.job_id, self.name, self.out = slurm, job_id, name, out
        self.progress = JsonLines(out / "progress.jsonl") if out is not None else None
        self.output = slurm.workdir / f"{name}-{job_id}.out"

    def info(self) -> dict[str, str]:
        return self.slurm.job_info(self.job_id)

    @property
    def state(self) -> str:
        return self.info().get("JobState", "UNKNOWN")

    def ended(self) -> bool:
        return self.state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED")

    def read_log(self) -> str:
        with contextlib.suppress(OSError):
            return self.output.read_text(errors="replace")
        return ""

    def wait_until(self, what: str, predicate, timeout: float, interval: float = 0.2):
        """``predicate()``'s first truthy value; JobError if the job ends first or ``timeout`` passes."""
        def check():
            value = predicate()
            if not value and self.ended():
                raise JobError(f"{self.name} (Slurm job {self.job_id}) ended ({self.state}) while waiting for {what}:\n"
                               f"{self.read_log()[-3000:]}")
            return value
        return wait_until(what, check, timeout, interval)

    def wait_ended(self, timeout: float) -> dict[str, str]:
        """Wait for the job's end; its ``scontrol show job`` fields."""
        wait_until(f"Slurm job {self.job_id} ({self.name}) to end", self.ended, timeout, 0.3)
        return self.info()


class SlurmCluster:
    """Slurm daemons around an :class:`ElasticCluster` of ``hosts`` hosts; see the module docstring."""

    def __init__(self, workdir: Path, hosts: int = 3, **elastic_options):
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        self.workdir = Path(workdir) / "slurm"
        self.elastic = ElasticCluster(Path(workdir), hosts, node_agents=False, **elastic_options)
        self._hosts = hosts
        self._procs: dict[str, subprocess.Popen] = {}
        self._munge_dir: Path | None = None
        self.conf = self.workdir / "slurm.conf"
        self.jobs: list[SlurmJob] = []

    # -- set-up and tear-down ------------------------------------------------

    def __enter__(self) -> "SlurmCluster":
        self.elastic.__enter__()
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
            self._start_munged()
            self._write_conf()
            self._spawn("slurmctld", [_exe("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            for host in [LAUNCHER, *self.elastic.bed.hosts]:
                self.start_slurmd(host)
            wait_until("every slurmd registered with slurmctld", self._all_nodes_up, 60, 0.5)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        try:
            with contextlib.suppress(Exception):  # best effort: the daemons die next anyway
                if self.jobs:
                    self._run("scancel", "--full", "--signal=KILL", *[j.job_id for j in self.jobs], check=False)
            for name, proc in reversed(list(self._procs.items())):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            self._procs.clear()
            if self._munge_dir is not None:
                shutil.rmtree(self._munge_dir, ignore_errors=True)
                self._munge_dir = None
        finally:
            self.elastic.close()

    # -- daemons -----------------------------------------------------------

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "ab")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=self.env())
        log.close()
        self._procs[name] = proc
        return proc

    def daemon_log(self, name: str) -> str:
        with contextlib.suppress(OSError):
            return (self.workdir / f"{name}.log").read_text(errors="replace")
        return ""

    def _start_munged(self) -> None:
        # munged refuses key and socket folders that others may write, and runs as
        # user munge: its folder is outside pytest's root-only tmp_path.
        munge = pwd.getpwnam("munge")
        self._munge_dir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-munge-", dir="/run"))
        self._munge_dir.chmod(0o755)
        os.chown(self._munge_dir, munge.pw_uid, munge.pw_gid)
        key = self._munge_dir / "munge.key"
        subprocess.run([_exe("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True, timeout=30)
        os.chown(key, munge.pw_uid, munge.pw_gid)
        key.chmod(0o400)
        self.munge_socket = self._munge_dir / "munge.socket"
        self._spawn("munged", ["setpriv", f"--reuid={munge.pw_uid}", f"--regid={munge.pw_gid}", "--clear-groups",
                               _exe("munged"), "--foreground", f"--socket={self.munge_socket}", f"--key-file={key}",
                               f"--pid-file={self._munge_dir / 'munged.pid'}",
                               f"--seed-file={self._munge_dir / 'seed'}",
                               f"--log-file={self._munge_dir / 'munged.log'}"])
        wait_until("munged's socket", self.munge_socket.exists, 20, 0.1)

    def _write_conf(self) -> None:
        bed = self.elastic.bed
        self.ctl_port = ports.reserve()[0]
        nodes = [LAUNCHER, *bed.hosts] + [f"{PREFIX}{self._hosts + i}" for i in range(1, SPARE_NODES + 1)]
        network = bed.bridge_address.rsplit(".", 1)[0]
        lines = [
            "ClusterName=hvdtb",
            f"SlurmctldHost={socket.gethostname()}({bed.bridge_address})",
            f"SlurmctldPort={self.ctl_port}",
            "SlurmdPort=6818",  # each slurmd in its own namespace: the same port never collides
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.munge_socket}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "MpiDefault=none", "ReturnToService=2", "SlurmdTimeout=30", "MinJobAge=600",
            f"KillWait={KILL_WAIT}", "SchedulerType=sched/backfill",
            f"StateSaveLocation={self.workdir / 'state'}",
            f"SlurmdSpoolDir={self.workdir / 'spool' / '%n'}",
            f"SlurmctldPidFile={self.workdir / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.workdir / 'slurmd.%n.pid'}",
            f"SlurmctldLogFile={self.workdir / 'slurmctld.daemon.log'}",
            f"SlurmdLogFile={self.workdir / 'slurmd.%n.daemon.log'}",
            "SlurmctldDebug=info", "SlurmdDebug=info",
        ]
        for name in nodes:
            index = int(name[len(PREFIX):])
            # the bed gives host i the address .10+i (netns.NetnsBed._make_host)
            lines.append(f"NodeName={name} NodeAddr={network}.{10 + index} CPUs=1 RealMemory=100 State=UNKNOWN")
        lines.append(f"PartitionName=bed Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP")
        (self.workdir / "state").mkdir(exist_ok=True)
        self.conf.write_text("\n".join(lines) + "\n")

    def start_slurmd(self, host: str) -> None:
        """Start ``host``'s slurmd inside its namespaces (a host added to the bed gets one this way)."""
        (self.workdir / "spool" / host).mkdir(parents=True, exist_ok=True)
        self._spawn(f"slurmd.{host}",
                    self.elastic.bed.on(host, [_exe("slurmd"), "-D", "-N", host, "-f", str(self.conf)]))

    def add_host(self) -> str:
        """A new bed host boots with its Consul agent and slurmd; Slurm can then allocate it."""
        host = self.elastic.add_host()
        self.start_slurmd(host)
        wait_until(f"{host}'s slurmd registered", lambda: self.node_state(host).split("+")[0] == "IDLE", 60, 0.5)
        return host

    def _all_nodes_up(self) -> bool:
        return all(self.node_state(h).split("+")[0] == "IDLE" for h in [LAUNCHER, *self.elastic.bed.hosts])

    # -- Slurm commands ----------------------------------------------------

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        return {**(os.environ if base is None else base), "SLURM_CONF": str(self.conf)}

    def _run(self, program: str, *args: str, check: bool = True,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        done = subprocess.run([_exe(program), *args], capture_output=True, text=True, timeout=60, env=self.env(env))
        if check and done.returncode != 0:
            raise RuntimeError(f"{program} {' '.join(args)} failed ({done.returncode}): "
                               f"{(done.stderr or done.stdout).strip()}")
        return done

    def node_state(self, node: str) -> str:
        done = self._run("scontrol", "show", "node", "-o", node, check=False)
        match = re.search(r"\bState=(\S+)", done.stdout)
        return match.group(1) if match else "UNKNOWN"

    def job_info(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o`` as a dict (``JobState``, ``ExitCode``, ``NodeList``...)."""
        done = self._run("scontrol", "show", "job", "-o", job_id, check=False)
        return dict(re.findall(r"(\w+)=(\S*)", done.stdout))

    def sbatch(self, script: Path, *args: str, node: str, name: str, env: dict[str, str],
               out: Path | None = None) -> SlurmJob:
        """Submit ``script`` to run on ``node`` with ``env`` as its whole environment; returns at submission."""
        output = self.workdir / f"{name}-%j.out"
        done = self._run("sbatch", "--parsable", f"--nodelist={node}", f"--job-name={name}", f"--output={output}",
                         "--export=ALL", str(script), *args, env=env)
        job = SlurmJob(self, done.stdout.strip().split(";")[0], name, out)
        self.jobs.append(job)
        return job

    def submit_worker(self, host: str, *agent_args: str, leave_timeout: float = 25.0) -> SlurmJob:
        """``worker.sbatch`` on ``host``: its node agent registers it (against the host's own Consul agent)."""
        elastic = self.elastic
        env = elastic.job_env(self.workdir, {"CONSUL_HTTP_ADDR": elastic.consul_addr(host),
                                             "HVD_ELASTIC_LEAVE_TIMEOUT": f"{leave_timeout:g}",
                                             "HVD_ELASTIC_LOG_LEVEL": "INFO",
                                             "HVD_ELASTIC_BIN": str(VENV_BIN / "hvd-elastic")})
        return self.sbatch(SCRIPTS / "worker.sbatch", "--cpu-slots", str(elastic.slots),
                           *elastic.node_agent_health_arguments(),
                           "--probe", "slurm", node=host, name=f"worker-{host}", env=env)

    def submit_launcher(self, np: int, min_np: int, max_np: int, *worker_args: str, name: str = "job",
                        horovodrun_args: tuple[str, ...] = ()) -> SlurmJob:
        """``launcher.sbatch`` on the launcher host: elastic horovodrun of the bed's training worker."""
        elastic = self.elastic
        out = elastic.workdir / name
        out.mkdir(parents=True, exist_ok=True)
        env = elastic.job_env(out, {"CONSUL_HTTP_ADDR": elastic.consul_addr(LAUNCHER),
                                    "HVD_ELASTIC_HOROVODRUN": str(VENV_BIN / "horovodrun"),
                                    "HVD_ELASTIC_DISCOVERY": str(VENV_BIN / "consul_hosts"),
                                    "HVD_ELASTIC_BIN": str(VENV_BIN / "hvd-elastic")})
        args = ["-np", str(np), "--min-np", str(min_np), "--max-np", str(max_np),
                *elastic.job_arguments(out, horovodrun_args, worker_args)]
        return self.sbatch(SCRIPTS / "launcher.sbatch", *args, node=LAUNCHER, name="launcher", env=env, out=out)

    def preempt(self, job: SlurmJob) -> None:
        """What Slurm does at preemption (and scancel): SIGTERM to every process of the job, the batch shell too."""
        self._run("scancel", "--full", "--signal=TERM", job.job_id)

    def drain(self, node: str, reason: str = "test bed") -> None:
        self._run("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")

    def resume(self, node: str) -> None:
        self._run("scontrol", "update", f"nodename={node}", "state=resume")

    def stop(self, launcher: SlurmJob, timeout: float = 240.0) -> dict[str, str]:
        """Ask the training to end at its next epoch boundary; the launcher job's final fields (COMPLETED expected)."""
        (launcher.out / "stop").touch()
        return launcher.wait_ended(timeout)
