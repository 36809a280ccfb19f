"""``hvd-elastic exec`` and ``hvd-elastic standby`` as real processes: what a forked worker sees,
how its end is reported, and every way the launcher must still start the command itself."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from hvd_elastic.standby import protocol
from testbed import VENV_BIN
from testbed.standby import StandbyProcess


WAIT = 60.0  # hang guard for one worker
PYTHON = str(VENV_BIN / "python")

REPORT = """
import json, os, sys
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "name": __name__, "path0": sys.path[0],
                  "foo": os.environ.get("FOO"), "ppid": os.getppid(), "pgid": os.getpgid(0),
                  "torch_loaded": "torch" in sys.modules}))
print("on stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


def script(tmp_path: Path, text: str, name: str = "w.py") -> Path:
    path = tmp_path / "job" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=WAIT)
    return proc.returncode, out, err


def test_a_forked_worker_runs_the_script_as_main_with_the_launchers_argv_env_cwd_and_stdio(standby, tmp_path):
    path = script(tmp_path, REPORT)
    code, out, err = finish(standby.exec(PYTHON, str(path), "7", cwd=path.parent, env={"FOO": "bar"}))
    seen = json.loads(out)
    assert code == 7, err
    assert seen["argv"] == [str(path), "7"] and seen["name"] == "__main__" and seen["foo"] == "bar"
    assert seen["cwd"] == str(path.parent) and seen["path0"] == str(path.parent)
    assert seen["ppid"] == standby.proc.pid and seen["torch_loaded"], "not forked from the standby"
    assert seen["pgid"] not in (standby.proc.pid, os.getpgid(0)), "the worker must lead its own process group"
    assert err.strip() == "on stderr"


def test_python_dash_m_and_dash_u_run_through_the_standby(standby, tmp_path):
    script(tmp_path, REPORT, "reportmod.py")
    code, out, err = finish(standby.exec(PYTHON, "-u", "-m", "reportmod", "0", cwd=tmp_path / "job"))
    seen = json.loads(out)
    assert code == 0, err
    assert seen["name"] == "__main__" and seen["argv"][1:] == ["0"] and seen["argv"][0].endswith("reportmod.py")
    assert seen["ppid"] == standby.proc.pid


def test_a_crash_in_the_script_is_a_traceback_from_the_users_code_and_exit_1(standby, tmp_path):
    path = script(tmp_path, "def f():\n    raise ValueError('boom')\nf()\n")
    code, _, err = finish(standby.exec(PYTHON, str(path)))
    assert code == 1
    assert "ValueError: boom" in err and str(path) in err
    assert "runpy" not in err and "hvd_elastic" not in err, err


def test_a_worker_killed_by_a_signal_kills_the_launcher_with_the_same_signal(standby, tmp_path):
    path = script(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    code, _, _ = finish(standby.exec(PYTHON, str(path)))
    assert code == -signal.SIGKILL


def test_sigterm_to_the_launcher_reaches_the_worker_and_its_exit_code_comes_back(standby, tmp_path):
    path = script(tmp_path, "import signal, sys, time\n"
                            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\n"
                            "print('ready', flush=True)\ntime.sleep(60)\n")
    proc = standby.exec(PYTHON, str(path))
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert finish(proc)[0] == 42


def test_a_killed_launcher_takes_its_worker_with_it(standby, tmp_path):
    path = script(tmp_path, "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)\n")
    proc = standby.exec(PYTHON, str(path))
    worker = psutil.Process(int(proc.stdout.readline()))
    proc.kill()
    proc.wait(WAIT)
    worker.wait(WAIT)  # the standby saw the connection close and sent SIGTERM (psutil raises on timeout)
    assert standby.wait_ready()["pid"] == standby.proc.pid, "the standby must keep serving"


def test_without_a_standby_the_command_runs_directly_with_one_line_saying_why(standby, tmp_path):
    path = script(tmp_path, REPORT)
    code, out, err = finish(standby.exec(PYTHON, str(path), "3", standby="other"))
    assert code == 3 and not json.loads(out)["torch_loaded"]
    lines = err.strip().splitlines()
    assert lines[0].startswith("hvd-elastic exec: no standby 'other' on this host") and lines[1:] == ["on stderr"]


@pytest.mark.parametrize("fault", ["killed", "frozen"])
def test_a_dead_or_hung_standby_never_blocks_the_start(tmp_path, fault):
    process = StandbyProcess(tmp_path)
    try:
        process.wait_ready()
        if fault == "killed":
            process.proc.kill()  # its socket file stays behind: connections are refused
            process.proc.wait(WAIT)
        else:
            process.proc.send_signal(signal.SIGSTOP)  # it accepts nothing: the hello never comes
        path = script(tmp_path, REPORT)
        code, out, err = finish(process.exec(PYTHON, str(path), "0"))
        assert code == 0 and not json.loads(out)["torch_loaded"]
        reason = "Connection refused" if fault == "killed" else "timed out"
        assert f"standby 't' did not answer ({reason}); starting" in err, err
    finally:
        if process.proc.poll() is None:
            process.proc.send_signal(signal.SIGCONT)
        process.stop()


def test_a_stale_standby_is_not_used_and_restarts_itself_on_the_new_code(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "heavy.py").write_text("VERSION = 1\n")
    process = StandbyProcess(tmp_path, "t", "--preload", "heavy", env={"PYTHONPATH": str(lib)})
    try:
        first = process.wait_ready()
        path = script(tmp_path, "import heavy, os\nprint(heavy.VERSION, os.getppid())\n")
        code, out, err = finish(process.exec(PYTHON, str(path)))
        assert (code, out.split()) == (0, ["1", str(process.proc.pid)]), err
        (lib / "heavy.py").write_text("VERSION = 2\n")
        os.utime(lib / "heavy.py", ns=(time.time_ns(), time.time_ns() + 10**9))  # mtime surely differs
        code, out, err = finish(process.exec(PYTHON, str(path)))
        assert code == 0 and out.split()[0] == "2"
        assert f"refused: stale: {lib / 'heavy.py'} changed since the standby started" in err, err
        again = process.wait_ready()  # re-executed: same pid, a fresh interpreter
        assert again["pid"] == first["pid"]
        code, out, err = finish(process.exec(PYTHON, str(path)))
        assert (code, out.split()) == (0, ["2", str(process.proc.pid)]), err
    finally:
        process.stop()


def test_another_launchers_code_is_refused_by_fingerprint(standby, tmp_path, monkeypatch):
    """A standby whose fingerprint differs from the launcher's (an upgrade since it started) is not used."""
    from hvd_elastic.commands import exec as launch

    monkeypatch.setenv(protocol.DIR_ENV, standby.env[protocol.DIR_ENV])
    monkeypatch.setattr(protocol, "fingerprint", lambda: "1-newer")
    with pytest.raises(launch.Fallback,
                       match=r"standby 't' runs other code \(1-[0-9a-f]{16}, this launcher is 1-newer\)"):
        launch.through_standby("t", [PYTHON, "-c", "1"])


NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (ip netns, setuid)")


@NEEDS_ROOT
def test_a_standby_in_another_network_namespace_is_not_used(standby, tmp_path):
    """Hosts that share a file system (containers, the test bed) must not fork each other's workers."""
    path = script(tmp_path, REPORT)
    netns = f"hvdtest{os.getpid()}"
    subprocess.run(["ip", "netns", "add", netns], check=True, timeout=WAIT)
    try:
        proc = subprocess.Popen(["ip", "netns", "exec", netns, str(VENV_BIN / "hvd-elastic"), "exec", "--standby", "t",
                                 "--", PYTHON, str(path), "0"], env=standby.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        code, out, err = finish(proc)
    finally:
        subprocess.run(["ip", "netns", "delete", netns], timeout=WAIT)
    assert code == 0 and not json.loads(out)["torch_loaded"], err
    assert "standby 't' runs in another network namespace" in err


@NEEDS_ROOT
def test_a_connection_from_another_user_is_refused_by_peer_credentials(tmp_path):
    # Directory and socket open to everyone (on a path others can reach), so only the uid check stands between.
    public = Path(tempfile.mkdtemp(prefix="hvd-elastic-test-standby."))
    process = StandbyProcess(tmp_path, socket_dir=public / "sockets")
    try:
        process.wait_ready()
        os.chmod(public, 0o755)
        os.chmod(process.path.parent, 0o755)
        os.chmod(process.path, 0o777)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover -- the child reports through the pipe
            try:
                os.close(read)
                os.setgid(65534)
                os.setuid(65534)
                os.environ[protocol.DIR_ENV] = str(process.path.parent)
                first = protocol.connect("t", 5.0)[1]
            except BaseException as exc:  # noqa: BLE001
                first = {"error": repr(exc)}
            os.write(write, json.dumps(first).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            first = json.loads(f.read())
        os.waitpid(pid, 0)
        assert first == {"refused": f"this standby serves uid {os.getuid()} only"}
        assert "refused a connection from uid 65534" in process.log.read_text()
    finally:
        process.stop()
        shutil.rmtree(public, ignore_errors=True)


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    hvd = str(VENV_BIN / "hvd-elastic")
    cases = [
        ([hvd, "exec"], {}, "no command: put it after --"),
        ([hvd, "exec", "python", "x.py"], {}, "unknown option 'python' (the command goes after --)"),
        ([hvd, "exec", "--standby", "../x", "--", "true"], {}, "standby name '../x' is not"),
        ([hvd, "exec", "--", "true"], {"HVD_ELASTIC_STANDBY_TIMEOUT": "soon"},
         "HVD_ELASTIC_STANDBY_TIMEOUT='soon' is not a duration in (0, 60s]"),
        ([hvd, "standby", "--name", "a/b"], {}, "'a/b' is not a standby name"),
        ([hvd, "standby", "--preload", "torch,not-a-module"], {}, "'not-a-module' is not a module name"),
    ]
    for argv, extra, message in cases:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=WAIT,
                             env={**os.environ, protocol.DIR_ENV: str(tmp_path), **extra})
        assert out.returncode == 2, (argv, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1 and message in out.stderr, (argv, out.stderr)


def test_a_socket_directory_too_long_for_a_unix_socket_is_named(tmp_path):
    long_dir = str(tmp_path / ("d" * 100))
    env = {**os.environ, protocol.DIR_ENV: long_dir}
    standby = subprocess.run([str(VENV_BIN / "hvd-elastic"), "standby"], capture_output=True, text=True,
                             timeout=120, env=env)
    assert standby.returncode == 1 and "over the 107 bytes a Unix socket address holds" in standby.stderr
    launcher = subprocess.run([str(VENV_BIN / "hvd-elastic"), "exec", "--", "true"], capture_output=True, text=True,
                              timeout=WAIT, env=env)
    assert launcher.returncode == 0 and f"set {protocol.DIR_ENV} to a shorter directory; starting true directly" \
        in launcher.stderr


def test_a_command_that_cannot_run_is_exit_127(tmp_path):
    out = subprocess.run([str(VENV_BIN / "hvd-elastic"), "exec", "--", str(tmp_path / "missing")],
                         capture_output=True, text=True, timeout=WAIT,
                         env={**os.environ, protocol.DIR_ENV: str(tmp_path)})
    assert out.returncode == 127 and "cannot run" in out.stderr.splitlines()[-1]


def test_a_missing_preload_module_stops_the_standby_with_exit_1(tmp_path):
    out = subprocess.run([str(VENV_BIN / "hvd-elastic"), "standby", "--preload", "no_such_module_xyz"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, protocol.DIR_ENV: str(tmp_path)})
    assert out.returncode == 1
    assert "cannot preload 'no_such_module_xyz': ModuleNotFoundError" in out.stderr


def test_a_forked_worker_is_found_on_the_node_through_its_launcher(standby, tmp_path):
    """drain --wait and node-agent --leave-timeout read the process table: the launcher stands for the worker."""
    from hvd_elastic.nodeagent import leave

    path = script(tmp_path, "import os, sys, time\nprint(os.getpid(), flush=True)\nsys.stdin.read()\n")
    proc = standby.exec(PYTHON, str(path), env={"HOROVOD_HOSTNAME": "localhost", "HOROVOD_RANK": "0"},
                        stdin=subprocess.PIPE)
    worker = int(proc.stdout.readline())
    assert proc.pid in leave.local_workers() and worker not in leave.local_workers()
    proc.stdin.close()  # the worker reads EOF and ends; so does its launcher
    assert proc.wait(WAIT) == 0
    assert proc.pid not in leave.local_workers()


class _HeldReply:
    """A standby that speaks the protocol by hand and answers the run request only when told.

    So a test can signal the launcher in the window between its request and the
    worker's pid, the window in which a worker forked by a real standby may
    already run (CI once saw a SIGTERM there kill the launcher: -15, not the
    worker's 42).
    """

    def __init__(self, directory: Path, name: str = "held"):  # protocol.DIR_ENV must name ``directory``
        self.name = name
        directory.mkdir(mode=0o700, exist_ok=True)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(str(protocol.socket_path(name)))
        self.listener.listen(1)
        self.listener.settimeout(WAIT)
        self.conn: socket.socket | None = None

    def take_request(self) -> dict:
        """Accept the launcher, greet it as a usable standby, and return its run request."""
        self.conn, _ = self.listener.accept()
        self.conn.settimeout(WAIT)
        protocol.send(self.conn, {"hello": protocol.fingerprint(), "python": PYTHON, "pid": os.getpid(),
                                  "netns": protocol.network_namespace()})
        request, fds = protocol.receive(self.conn, max_fds=3)
        for fd in fds:
            os.close(fd)
        return request

    def reply(self, message: dict) -> None:
        protocol.send(self.conn, message)

    def close(self) -> None:
        for sock in (self.conn, self.listener):
            if sock is not None:
                sock.close()


@pytest.fixture
def held(tmp_path, monkeypatch):
    monkeypatch.setenv(protocol.DIR_ENV, str(tmp_path / "sockets"))
    server = _HeldReply(tmp_path / "sockets")
    yield server
    server.close()


def _launcher(held: _HeldReply, *command: str) -> subprocess.Popen:
    return subprocess.Popen([str(VENV_BIN / "hvd-elastic"), "exec", "--standby", held.name, "--", *command],
                            env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_signal_before_the_workers_pid_is_known_reaches_the_worker(held, tmp_path):
    path = script(tmp_path, "pass\n")
    launcher = _launcher(held, PYTHON, str(path))
    assert "run" in held.take_request()
    launcher.send_signal(signal.SIGTERM)  # the worker may be running already; its pid is not here yet
    time.sleep(0.3)
    assert launcher.poll() is None, "a SIGTERM before the pid killed the launcher instead of reaching the worker"
    # The "forked worker": its own process group, exits 42 on SIGTERM.
    worker = subprocess.Popen([PYTHON, "-c", "import signal, sys, time\n"
                               "signal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\n"
                               "print('ready', flush=True)\ntime.sleep(60)\n"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert worker.stdout.readline().strip() == "ready"
        held.reply({"pid": worker.pid})
        assert worker.wait(WAIT) == 42  # the held SIGTERM went to the worker's process group
    finally:
        worker.kill()
        worker.wait()
    held.reply({"exit": 42})
    assert finish(launcher)[0] == 42


def test_a_signal_held_for_a_worker_that_never_starts_ends_the_launcher_without_running_the_command(held, tmp_path):
    marker = tmp_path / "ran"
    path = script(tmp_path, f"open({str(marker)!r}, 'w').close()\n")
    launcher = _launcher(held, PYTHON, str(path))
    held.take_request()
    launcher.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    held.reply({"refused": "busy"})  # no worker: the launcher would start the command itself
    code, _, err = finish(launcher)
    assert code == -signal.SIGTERM, err  # it dies of the SIGTERM it was sent, as it would have without a standby
    assert not marker.exists()
