"""The worker container's entrypoint (ConfigMap hvd-elastic-worker-entrypoint), run as PID 1 of a PID namespace.

A container is a PID namespace whose first process is the entrypoint: ``unshare --pid --fork --mount-proc`` makes
one here, so the script meets what it meets in a pod, notably that a PID 1 ignores every signal it set no handler
for.  Kubernetes' stop is one SIGTERM to that process (after the preStop hook), which is what the tests send.  The
script runs as the manifest has it, with only what a test must change: the binaries' folder (this venv's), sshd
and ssh-keygen (stand-ins: no daemon on port 22, no host keys written), sshd's privilege-separation folder, the
standby's socket directory (below a 0777 folder, as an emptyDir is, short enough for a Unix socket) and, for the
fast tests, the standby (a stand-in that logs its signals).  The slow test runs the real ``hvd-elastic standby``
with the ConfigMap's preloads and starts a worker through it with the launcher's worker command.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from hvd_elastic.standby import protocol
from k8s_manifests import IMAGE_BIN, commands, configmaps, pods, render_env
from testbed import child_env, wait_until

VENV_BIN = str(Path(sys.executable).parent)
FIELDS = {"metadata.name": "hvd-worker-0", "metadata.namespace": "default", "status.hostIP": "127.0.0.1",
          "status.podIP": "127.0.0.1"}
WORKER_POD = next(pod for pod in pods() if pod.where.startswith("statefulset/worker-statefulset.yaml"))
LAUNCHER_POD = next(pod for pod in pods() if pod.where.startswith("statefulset/launcher-job.yaml"))
SCRIPT = configmaps()["hvd-elastic-worker-entrypoint"]["worker-entrypoint.sh"]
NAME = configmaps()["hvd-elastic-standby"]["HVD_ELASTIC_STANDBY"]
WAIT = 30.0  # hang guard
READY_WAIT = 240.0  # the real standby's imports (torch, horovod, the preloads) on a loaded machine

STUB_SSHD = """#!/bin/sh
echo "$@" > "$STUB_LOG/sshd.args"
trap 'echo TERM >> "$STUB_LOG/sshd.signals"; exit 0' TERM
[ -z "${STUB_SSHD_EXIT:-}" ] || exit "$STUB_SSHD_EXIT"
while :; do sleep 0.05; done
"""
STUB_KEYGEN = """#!/bin/sh
echo "$@" > "$STUB_LOG/ssh-keygen.args"
"""
#: A standby that takes 1 s to end after SIGTERM (its workers finishing), logging each signal; or that cannot start.
STUB_STANDBY = """#!/bin/sh
echo "$@" > "$STUB_LOG/standby.args"
[ -z "${STUB_STANDBY_EXIT:-}" ] || exit "$STUB_STANDBY_EXIT"
trap 'echo TERM >> "$STUB_LOG/standby.signals"; sleep 1; echo exited >> "$STUB_LOG/standby.signals"; exit 0' TERM
while :; do sleep 0.05; done
"""
#: The worker: says who forked it, lives $1 seconds, then says it finished.
WORKER = """import json, os, sys, time
open(sys.argv[2] + ".started", "w").write(json.dumps({"ppid": os.getppid()}))
time.sleep(float(sys.argv[1]))
open(sys.argv[2] + ".done", "w").write("done")
"""


class Pod:
    """The entrypoint running as PID 1 of its own PID namespace, in the worker container's environment."""

    def __init__(self, tmp_path: Path, short: Path, *, stub_standby: bool, extra_env: dict[str, str] | None = None):
        self.log_dir = tmp_path / "stub-log"
        self.log_dir.mkdir()
        stubs = tmp_path / "stubs"
        stubs.mkdir()
        for name, text in [("sshd", STUB_SSHD), ("ssh-keygen", STUB_KEYGEN), ("hvd-elastic", STUB_STANDBY)]:
            (stubs / name).write_text(text)
            (stubs / name).chmod(0o755)
        script = SCRIPT
        for old, new in [("ssh-keygen -A", f"{stubs}/ssh-keygen -A"), ("/usr/sbin/sshd ", f"{stubs}/sshd "),
                         ("/run/sshd", str(tmp_path / "run-sshd")),
                         (f"{IMAGE_BIN}/", f"{stubs}/" if stub_standby else f"{VENV_BIN}/")]:
            assert script.count(old) == 1, f"the entrypoint no longer has one {old!r}"
            script = script.replace(old, new)
        self.script = tmp_path / "worker-entrypoint.sh"
        self.script.write_text(script)
        empty_dir = short / "emptydir"
        empty_dir.mkdir()
        empty_dir.chmod(0o777)  # as the kubelet makes an emptyDir
        env = render_env(WORKER_POD, WORKER_POD.container("worker"), FIELDS)
        assert env[protocol.DIR_ENV] == "/run/hvd-elastic/standby"
        self.standby_dir = empty_dir / "standby"
        self.env = child_env(**{**env, protocol.DIR_ENV: str(self.standby_dir), "STUB_LOG": str(self.log_dir),
                                **(extra_env or {})})
        self.output = tmp_path / "entrypoint.log"
        with self.output.open("w") as out:
            self.proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "/bin/sh", str(self.script)],
                                         env=self.env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def pid1(self) -> psutil.Process:
        """The entrypoint's shell, PID 1 inside, as this namespace numbers it."""
        def found():
            children = psutil.Process(self.proc.pid).children()
            return children[0] if children else None
        return wait_until("the namespace's PID 1", found, WAIT)

    def log(self, name: str) -> str:
        path = self.log_dir / name
        return path.read_text() if path.exists() else ""

    def wait_for(self, what: str, predicate, timeout: float = WAIT):
        def check():
            assert self.proc.poll() is None or predicate(), f"the entrypoint ended ({self.proc.returncode}) " \
                                                            f"waiting for {what}: {self.output.read_text()[-3000:]}"
            return predicate()
        return wait_until(what, check, timeout)

    def stop(self) -> None:
        """Kubernetes' stop: one SIGTERM to the container's PID 1."""
        self.pid1().send_signal(signal.SIGTERM)

    def kill(self) -> None:
        if self.proc.poll() is None:
            for child in psutil.Process(self.proc.pid).children():
                child.kill()  # PID 1 gone: the kernel kills the rest of the namespace
            self.proc.wait(WAIT)


@contextmanager
def pod(tmp_path: Path, **kwargs) -> Iterator[Pod]:
    with tempfile.TemporaryDirectory(prefix="k8s-", dir="/tmp") as short:
        running = Pod(tmp_path, Path(short), **kwargs)
        try:
            yield running
        finally:
            running.kill()


def test_a_stop_reaches_sshd_and_the_standby_once_and_the_container_outlives_the_standby(tmp_path):
    with pod(tmp_path, stub_standby=True) as running:
        running.wait_for("sshd and the standby to start", lambda: running.log("sshd.args") and running.log(
            "standby.args"))
        assert running.log("ssh-keygen.args") == "-A\n"
        assert running.log("standby.args").split() == [
            "standby", "--name", NAME, "--preload", configmaps()["hvd-elastic-standby"]["HVD_ELASTIC_STANDBY_PRELOAD"]]
        assert "-D" in running.log("sshd.args").split()
        time.sleep(0.3)
        assert running.proc.poll() is None
        running.stop()
        running.wait_for("sshd to get the stop", lambda: running.log("sshd.signals") == "TERM\n")
        running.wait_for("the standby to get the stop", lambda: running.log("standby.signals").startswith("TERM\n"))
        assert running.proc.poll() is None  # the standby takes 1 s to end: the container waits for it
        assert running.proc.wait(WAIT) == 0, running.output.read_text()
        assert running.log("standby.signals") == "TERM\nexited\n"  # ONE SIGTERM: a second would end its workers


def test_sshd_ending_by_itself_ends_the_container_with_a_failure(tmp_path):
    with pod(tmp_path, stub_standby=True, extra_env={"STUB_SSHD_EXIT": "3"}) as running:
        assert running.proc.wait(WAIT) == 1, running.output.read_text()
        assert running.log("sshd.args")


def test_a_standby_that_cannot_start_does_not_end_the_container(tmp_path):
    """A preload missing from the image, say: the standby exits 1 and sshd keeps serving (workers start directly)."""
    with pod(tmp_path, stub_standby=True, extra_env={"STUB_STANDBY_EXIT": "1"}) as running:
        running.wait_for("sshd and the standby to start", lambda: running.log("sshd.args") and running.log(
            "standby.args"))
        time.sleep(1.0)
        assert running.proc.poll() is None and not running.log("sshd.signals")
        running.stop()
        assert running.proc.wait(WAIT) == 0, running.output.read_text()  # at once: no standby to wait for


@pytest.mark.slow
def test_the_real_standby_forks_the_launchers_worker_command_and_a_stop_lets_the_worker_finish(tmp_path,
                                                                                               monkeypatch):
    from horovod.runner import launch as horovod_launch

    (launcher_cmd,) = [c for c in commands(LAUNCHER_POD, LAUNCHER_POD.container("launcher"),
                                           render_env(LAUNCHER_POD, LAUNCHER_POD.container("launcher"),
                                                      FIELDS))
                       if c.argv[0].endswith("/horovodrun")]
    monkeypatch.setattr(sys, "argv", ["horovodrun", *launcher_cmd.argv[1:]])
    worker_command = horovod_launch.parse_args().command
    split = worker_command.index("--")
    worker_script = tmp_path / "worker.py"
    worker_script.write_text(WORKER)
    with pod(tmp_path, stub_standby=False) as running:
        monkeypatch.setenv(protocol.DIR_ENV, str(running.standby_dir))

        def hello():
            try:
                sock, first = protocol.connect(NAME, 1.0)
                sock.close()
                return first
            except (OSError, protocol.ProtocolError):
                return None
        first = running.wait_for("the standby to answer", hello, READY_WAIT)
        assert protocol.unusable(first) is None, first
        assert os.path.dirname(first["python"]) == VENV_BIN  # the interpreter the launcher's command names
        assert (running.standby_dir.stat().st_mode & 0o777) == 0o700

        # The launcher's worker command, as horovodrun runs it in an ssh session: the launcher's environment.
        argv = [arg.replace(IMAGE_BIN, VENV_BIN) for arg in worker_command[:split + 2]]
        assert argv[-1] == f"{VENV_BIN}/python"
        marker = tmp_path / "worker"
        launcher_env = render_env(LAUNCHER_POD, LAUNCHER_POD.container("launcher"), FIELDS)
        env = child_env(**{**launcher_env, protocol.DIR_ENV: str(running.standby_dir)})
        worker = subprocess.Popen([*argv, str(worker_script), "4", str(marker)], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        try:
            started = running.wait_for("the worker to start", lambda: Path(f"{marker}.started").exists())
            assert started
            assert json.loads(Path(f"{marker}.started").read_text())["ppid"] == first["pid"]  # forked by it

            running.stop()
            running.wait_for("the standby's socket to go", lambda: not (running.standby_dir /
                                                                         f"standby-{NAME}.sock").exists())
            assert running.proc.poll() is None and not Path(f"{marker}.done").exists()
            assert running.proc.wait(READY_WAIT) == 0, running.output.read_text()[-3000:]
            out, err = worker.communicate(timeout=WAIT)
        finally:
            worker.kill()
        assert worker.returncode == 0 and "directly" not in err, err
        assert Path(f"{marker}.done").read_text() == "done"  # it finished its step: the stop did not cut it short
        assert running.log("sshd.signals") == "TERM\n"
