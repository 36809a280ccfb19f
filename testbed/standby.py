"""A real ``hvd-elastic standby`` process with a socket directory of its own, for tests and benchmarks."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from hvd_elastic.standby import protocol

from .env import VENV_BIN, child_env

READY_WAIT = 120.0  # seconds for torch + horovod imports on a loaded machine: a hang guard


class StandbyProcess:
    """``hvd-elastic standby --name NAME`` with ``HVD_ELASTIC_STANDBY_DIR`` under the test's directory."""

    def __init__(self, tmp: Path, name: str = "t", *args: str, env: dict[str, str] | None = None,
                 socket_dir: Path | None = None):
        """Start it (``args``: more ``hvd-elastic standby`` flags); ``env`` on top of :func:`child_env`'s."""
        self.name = name
        socket_dir = socket_dir or tmp / "sockets"
        self.env = child_env(HVD_ELASTIC_STANDBY_DIR=str(socket_dir), **(env or {}))
        self.log = tmp / f"standby-{name}.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen([str(VENV_BIN / "hvd-elastic"), "standby", "--name", name, *args],
                                         env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.path = socket_dir / f"standby-{name}.sock"

    def hello(self, timeout: float = 1.0) -> dict | None:
        old = os.environ.get(protocol.DIR_ENV)
        os.environ[protocol.DIR_ENV] = self.env[protocol.DIR_ENV]
        try:
            sock, first = protocol.connect(self.name, timeout)
            sock.close()
            return first
        finally:
            if old is None:
                del os.environ[protocol.DIR_ENV]
            else:
                os.environ[protocol.DIR_ENV] = old

    def wait_ready(self, pid: int | None = None) -> dict:
        """The hello of a ready standby (with ``pid``: of a standby whose pid is that one)."""
        deadline = time.monotonic() + READY_WAIT
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the standby exited ({self.proc.returncode}): {self.log.read_text()}"
            try:
                hello = self.hello()
                if hello and (pid is None or hello.get("pid") == pid):
                    return hello
            except (OSError, protocol.ProtocolError):
                pass
            time.sleep(0.1)
        raise AssertionError(f"standby {self.name} not ready after {READY_WAIT:.0f} s: {self.log.read_text()}")

    def exec(self, *command: str, standby: str | None = None, **kwargs) -> subprocess.Popen:
        """Start ``hvd-elastic exec [--standby NAME] -- COMMAND`` in this standby's environment."""
        env = {**self.env, **kwargs.pop("env", {})}
        return subprocess.Popen([str(VENV_BIN / "hvd-elastic"), "exec", "--standby", standby or self.name, "--",
                                 *command], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                **kwargs)

    def __enter__(self) -> "StandbyProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
