"""One launched process tree: horovodrun, mpirun, a node agent, a standby.

:class:`Job` is the only place the demo (and the tests and benchmarks, through
the unshipped ``testbed/``) start and kill such trees.  Contracts:

* the command runs in a new session (its own process group), with stdout and
  stderr in ``<logdir>/<name>.<attempt>.log``; :meth:`Job.start` may be called
  again once an attempt has ended (a restarted job) and opens a new log;
* every process of the job carries a marker in its environment
  (``HVD_LOCAL_JOB``, inherited by whatever it starts, nested jobs included);
* :meth:`Job.kill` SIGKILLs the launcher, every descendant still alive (also
  those that left the process group or session, as Horovod's workers do, and
  those orphaned by a launcher that died first: found by the marker) and
  whatever the ``also_kill`` callbacks name (workers on other hosts, started
  with a fresh environment by sshd); it is idempotent, and the context manager
  calls it on every exit path;
* waiting is always bounded: :func:`wait_until` and :meth:`Job.wait_until` fail
  with the log tail when the deadline passes or the job exits first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import psutil

from hvd_elastic.errors import HvdElasticError

from .env import HVD_ELASTIC, VENV_BIN

#: The environment variable that marks a job's processes: space-separated marks of every enclosing job.
#: Not ``HVD_ELASTIC_*``: child_env drops those, and a nested job must keep its parents' marks.
MARK_ENV = "HVD_LOCAL_JOB"


class JobError(HvdElasticError, AssertionError):
    """A job failed, exited early or did not reach a state in time (message carries its log tail).

    An ``AssertionError`` so pytest reports it as a failed expectation, not an error in the harness.
    """


def wait_until(what: str, predicate: Callable[[], object], timeout: float, interval: float = 0.1,
               jobs: Iterable["Job"] = ()):
    """Poll ``predicate`` until truthy and return its value.

    Raises :class:`JobError` once ``timeout`` seconds have passed (naming ``what`` and the
    last value) or as soon as one of ``jobs`` is no longer running; either message ends
    with the jobs' log tails.
    """
    jobs = list(jobs)
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        for job in jobs:
            if not job.running():
                raise JobError(f"{job.name} exited ({job.returncode}) before {what}\n{job.log_tail()}")
        if time.monotonic() > deadline:
            tails = "".join(f"\n--- {job.name}\n{job.log_tail()}" for job in jobs)
            raise JobError(f"timed out after {timeout:.0f}s waiting for {what}; last value {value!r}{tails}")
        time.sleep(interval)


class Job:
    """A command in its own session, logging to a file; see the module docstring for the contracts."""

    def __init__(
        self,
        cmd: Sequence[str | os.PathLike[str]],
        *,
        env: dict[str, str],
        logdir: Path,
        name: str = "job",
        cwd: Path | None = None,
        also_kill: Callable[[], Iterable[int]] | None = None,
    ) -> None:
        self.cmd = [str(c) for c in cmd]
        self.env = env
        self.logdir = Path(logdir)
        self.name = name
        self.cwd = cwd
        self.also_kill = also_kill
        self.logs: list[Path] = []
        self.proc: subprocess.Popen | None = None
        self._marks: list[str] = []  # one per attempt: kill() also finds an earlier attempt's orphans

    # -- lifecycle ----------------------------------------------------------

    def start(self, **extra_env: str) -> "Job":
        """Start an attempt (``extra_env`` on top of the job's environment); returns the job."""
        if self.running():
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self.logdir.mkdir(parents=True, exist_ok=True)
        log = self.logdir / f"{self.name}.{len(self.logs)}.log"
        self.logs.append(log)
        mark = uuid.uuid4().hex
        self._marks.append(mark)
        env = {**self.env, **extra_env}
        env[MARK_ENV] = " ".join(filter(None, [env.get(MARK_ENV), mark]))
        with open(log, "w") as out:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(self.cmd, env=env, cwd=self.cwd, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        """The launcher's pid (of the current attempt)."""
        return self._started().pid

    @property
    def returncode(self) -> int | None:
        """The launcher's exit code, None while it runs (or before it was started)."""
        return None if self.proc is None else self.proc.poll()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout: float) -> int:
        """The exit code; on timeout the job is killed and :class:`JobError` raised."""
        try:
            return self._started().wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise JobError(f"{self.name} did not exit within {timeout:.0f}s\n{self.log_tail()}") from None

    def finish(self, timeout: float) -> None:
        """Wait for a clean exit (0); anything else is a :class:`JobError` with the log tail."""
        code = self.wait(timeout)
        if code != 0:
            raise JobError(f"{self.name} exited with {code}\n{self.log_tail()}")

    def stop(self, timeout: float = 30.0, sig: int = signal.SIGTERM) -> int:
        """Ask the job to end (``sig`` to its process group) and return its exit code.

        Whatever is left afterwards is killed; a job that does not exit within ``timeout``
        is killed too, and :class:`JobError` raised (as :meth:`wait`).
        """
        self.signal(sig)
        try:
            return self.wait(timeout)
        finally:
            self.kill()

    def wait_until(self, what: str, predicate: Callable[[], object], timeout: float, interval: float = 0.1):
        """:func:`wait_until` that also fails as soon as this job exits."""
        return wait_until(what, predicate, timeout, interval, jobs=[self])

    # -- output -------------------------------------------------------------

    def read_log(self) -> str:
        """The current attempt's output so far ("" before the first start)."""
        if not self.logs:
            return ""
        with contextlib.suppress(OSError):
            return self.logs[-1].read_text(errors="replace")
        return ""

    def log_tail(self, chars: int = 4000) -> str:
        return self.read_log()[-chars:]

    # -- signals ------------------------------------------------------------

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the job's process group (e.g. SIGTERM for a graceful stop, SIGSTOP to freeze it).

        Nothing is sent once the launcher has exited: its pid may then belong to someone else.
        """
        if self.running():  # not reaped, so the pid (and the group id) is still ours
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL everything the job started, here and (through ``also_kill``) elsewhere; then reap."""
        if self.proc is None:
            return
        launcher_alive = self.proc.poll() is None  # checked before its pid is used: see signal()
        victims: list[psutil.Process] = []
        if launcher_alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                root = psutil.Process(self.proc.pid)
                victims = [root, *root.children(recursive=True)]
        if self.also_kill is not None:
            for pid in self.also_kill():
                with contextlib.suppress(psutil.NoSuchProcess):
                    victims.append(psutil.Process(pid))
        _sigkill(victims)
        if launcher_alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        # Marked processes outside the tree (orphans, other sessions).  A process that
        # was not killed yet may still fork: sweep until a pass finds nobody, bounded.
        for _ in range(10):
            marked = self._marked()
            if not marked:
                break
            _sigkill(marked)
            victims += marked
        psutil.wait_procs(victims, timeout=10)

    def _marked(self) -> list[psutil.Process]:
        """Live processes (not zombies, not this one) carrying one of this job's marks."""
        marks = set(self._marks)
        found = []
        for proc in psutil.process_iter(["environ", "status"], ad_value=None):
            env = proc.info["environ"] or {}
            if (proc.pid != os.getpid() and proc.info["status"] != psutil.STATUS_ZOMBIE
                    and marks.intersection(env.get(MARK_ENV, "").split())):
                found.append(proc)
        return found

    def _started(self) -> subprocess.Popen:
        if self.proc is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.proc

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc_info) -> None:
        self.kill()


def _sigkill(procs: Iterable[psutil.Process]) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGKILL)


def start_node_agent(*args: str, env: dict[str, str], logdir: Path, name: str = "node-agent",
                     log_level: str = "INFO") -> Job:
    """``hvd-elastic node-agent *args`` as a started :class:`Job`.

    The agent finds its Consul agent through ``env`` (``CONSUL_HTTP_ADDR``) or an
    ``--http-addr`` in ``args``; at INFO its log shows registrations and health changes.
    Stop it with :meth:`Job.stop` (SIGTERM: it deregisters) or :meth:`Job.kill` (it does not).
    """
    return Job([HVD_ELASTIC, "--log-level", log_level, "node-agent", *args], env=env, logdir=logdir,
               name=name).start()


def horovodrun_elastic(discovery: str | Path, np: int, min_np: int, max_np: int, *extra: str) -> list[str]:
    """``horovodrun`` in elastic mode with ``discovery`` as its host discovery script."""
    return [str(VENV_BIN / "horovodrun"), "-np", str(np), "--min-np", str(min_np), "--max-np", str(max_np),
            "--host-discovery-script", str(discovery), *extra]
