"""The hvd-elastic command: global options, --help everywhere, and doctor's exit paths."""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_elastic import __version__
from hvd_elastic.cli import COMMANDS, module_name
from hvd_elastic.commands.doctor import parse_check_build

HVD_ELASTIC = [sys.executable, "-m", "hvd_elastic.cli"]


def hvd_elastic(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*HVD_ELASTIC, *args], capture_output=True, text=True, timeout=180,
                          env={**os.environ, **(env or {})})


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_version():
    out = hvd_elastic("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"hvd-elastic {__version__}"


def test_no_command_prints_help_and_exits_2():
    out = hvd_elastic()
    assert out.returncode == 2
    assert "doctor" in out.stdout and "discover" in out.stdout


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_subcommand_has_help(command):
    out = hvd_elastic(command, "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: hvd-elastic {command}")


def test_the_registry_maps_one_to_one_to_the_command_modules():
    """Each subcommand is ``hvd_elastic/commands/<name>.py`` and each public module there is a subcommand."""
    import hvd_elastic.commands

    folder = Path(hvd_elastic.commands.__file__).parent
    modules = {path.stem for path in folder.glob("*.py") if not path.stem.startswith("_")}
    assert modules == {name.replace("-", "_") for name in COMMANDS}
    for name in COMMANDS:
        module = importlib.import_module(module_name(name))
        assert callable(module.add_arguments) and callable(module.run), name


def test_unknown_option_is_a_usage_error():
    out = hvd_elastic("doctor", "--min-free-gib", "lots")
    assert out.returncode == 2
    assert "'lots' is not a number" in out.stderr


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_bad_input_is_one_line_naming_the_value(command):
    out = hvd_elastic(command, "--no-such-flag=sixty")
    assert out.returncode == 2
    # One line, no usage block; report first misses its RUN_DIR, which it names.
    expected = ("the following arguments are required: RUN_DIR" if command == "report"
                else "unrecognized arguments: --no-such-flag=sixty")
    assert (out.stderr.count("\n") == 1 and out.stderr.startswith("hvd-elastic")
            and out.stderr.endswith(expected + "\n")), out.stderr


def test_a_bad_value_is_one_line_naming_it_and_what_was_expected():
    out = hvd_elastic("node-agent", "--deregister-after", "30s")
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == ("hvd-elastic node-agent: error: argument --deregister-after: "
                          "'30s' is not a duration of at least 1m (expected e.g. 90s, 10m, 1h)\n")


CHECK_BUILD = """Horovod v0.28.1:

Available Frameworks:
    [ ] TensorFlow
    [X] PyTorch
    [ ] MXNet

Available Controllers:
    [X] MPI
    [ ] Gloo

Available Tensor Operations:
    [ ] NCCL
    [X] Gloo
"""


def test_parse_check_build_keeps_sections_apart():
    build = parse_check_build(CHECK_BUILD)
    assert build["Available Frameworks"] == {"TensorFlow": False, "PyTorch": True, "MXNet": False}
    assert build["Available Controllers"] == {"MPI": True, "Gloo": False}
    assert build["Available Tensor Operations"]["Gloo"] is True


def test_doctor_fails_when_consul_is_unreachable(tmp_path):
    out = hvd_elastic("doctor", "--checkpoint-dir", str(tmp_path),
                      env={"CONSUL_HTTP_ADDR": f"127.0.0.1:{closed_port()}"})
    assert out.returncode == 1
    lines = {line.split()[1]: line for line in out.stdout.splitlines()}
    assert (lines["consul"].startswith("FAIL") and "cannot reach Consul at" in lines["consul"]
            and "fix:" in lines["consul"])
    assert lines["horovod"].startswith("ok") and "PyTorch yes, Gloo yes, MPI yes" in lines["horovod"]
    assert lines["torch"].startswith("ok")
    assert "required check(s) failed: consul" in out.stderr


def test_doctor_names_a_bad_consul_address(tmp_path):
    out = hvd_elastic("doctor", "--checkpoint-dir", str(tmp_path), env={"CONSUL_HTTP_ADDR": "127.0.0.1:eighty"})
    assert out.returncode == 2  # a bad setting is bad input, as for every command
    assert "CONSUL_HTTP_ADDR='127.0.0.1:eighty': port 'eighty' is not a number" in out.stdout


def test_doctor_fails_on_too_little_disk(tmp_path):
    out = hvd_elastic("doctor", "--checkpoint-dir", str(tmp_path), "--min-free-gib", "1e12",
                      env={"CONSUL_HTTP_ADDR": f"127.0.0.1:{closed_port()}"})
    assert out.returncode == 1
    disk = next(line for line in out.stdout.splitlines() if line.split()[1] == "disk")
    assert disk.startswith("FAIL") and "need 1e+12" in disk


def test_doctor_passes_against_a_consul_agent(tmp_path):
    from hvd_elastic.devagent import DevCluster

    with DevCluster(nodes=["gpu-a"]) as cluster:
        out = hvd_elastic("doctor", "--checkpoint-dir", str(tmp_path), "--min-free-gib", "0",
                          env={"CONSUL_HTTP_ADDR": cluster.addr("gpu-a")})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "\x00" not in out.stdout  # plain text, even where a library hands back C strings
    lines = {line.split()[1]: line for line in out.stdout.splitlines()}
    assert lines["consul"].startswith("ok") and "leader" in lines["consul"]
    # No GPU is only a warning unless --require-gpu.
    assert lines["gpus"].split()[0] in ("ok", "warn")


@pytest.mark.parametrize("hosts, bad", [("gpu-a,-oProxyCommand=sh", "-oProxyCommand=sh"), ("gpu-a,b c", "b c"),
                                        ("gpu-a,,gpu-b", ""), ("root@gpu-a", "root@gpu-a"),
                                        ("10.0.0.256", "10.0.0.256")])
def test_doctor_refuses_a_bad_host_name_before_any_ssh(hosts, bad, tmp_path):
    out = hvd_elastic("doctor", "--checkpoint-dir", str(tmp_path), "--hosts", hosts)
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == (f"hvd-elastic doctor: error: argument --hosts: {bad!r} is not a host name "
                          f"(an RFC 1123 name or an IPv4 address)\n")


def test_doctor_reads_the_marker_on_each_host_over_ssh(tmp_path):
    """A stand-in ssh first on PATH: for host ``shared`` it runs the remote command here (a host that mounts
    the same directory), for ``down`` it fails as ssh does (255).  The netns bed runs real ssh."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "ssh-calls"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(
        "#!/bin/sh\n"
        f"printf '%s\\n' \"$*\" >> '{calls}'\n"
        'while [ "$1" != "--" ]; do shift; done; shift\n'
        'host=$1; shift\n'
        'case "$host" in\n'
        '  shared) exec sh -c "$*" ;;\n'
        '  *) echo "ssh: connect to host $host port 22: Connection refused" >&2; exit 255 ;;\n'
        'esac\n')
    (bin_dir / "ssh").chmod(0o755)
    ckpt = tmp_path / "ckpt dir"  # a space: the remote path must be quoted
    ckpt.mkdir()
    out = hvd_elastic("doctor", "--checkpoint-dir", str(ckpt), "--hosts", "shared,down", "--min-free-gib", "0",
                      env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                           "CONSUL_HTTP_ADDR": f"127.0.0.1:{closed_port()}"})
    shared = [line for line in out.stdout.splitlines() if line.split()[1] == "shared"]
    assert shared[0] == f"ok    shared     shared sees {ckpt}"
    assert shared[1].startswith("FAIL  shared     down: ssh failed "
                                "(ssh: connect to host down port 22: Connection refused)")
    assert len(shared) == 2 and out.returncode == 1
    assert "shared" in out.stderr.split("failed: ")[1]
    assert os.listdir(ckpt) == []  # the marker is gone
    marker_reads = [line for line in calls.read_text().splitlines() if not line.startswith("-G ")]  # check_ssh
    assert len(marker_reads) == 2
    assert all(line.startswith("-o BatchMode=yes -o ConnectTimeout=10 -- ") for line in marker_reads)


@pytest.mark.parametrize("config, expected", [
    ("", "warn  ssh        no keep-alives to localhost (ServerAliveInterval 0)"),
    ("ServerAliveInterval 2\n  ServerAliveCountMax 3\n",
     "ok    ssh        keep-alives to localhost: a lost host's session ends after about 6 s"),
])
def test_doctor_reports_the_launchers_ssh_keep_alives(config, expected, tmp_path):
    """Real ``ssh -G`` with a given client configuration (a wrapper on PATH adds ``-F``)."""
    if not os.path.exists("/usr/bin/ssh"):
        pytest.fail("/usr/bin/ssh is missing: scripts/bootstrap.sh installs openssh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "ssh_config").write_text(f"Host *\n  {config}")
    (bin_dir / "ssh").write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F "{tmp_path / "ssh_config"}" "$@"\n')
    (bin_dir / "ssh").chmod(0o755)
    out = hvd_elastic("doctor", "--checkpoint-dir", str(tmp_path), "--min-free-gib", "0",
                      env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                           "CONSUL_HTTP_ADDR": f"127.0.0.1:{closed_port()}"})
    line = next(line for line in out.stdout.splitlines() if line.split()[1] == "ssh")
    assert line.startswith(expected), line
