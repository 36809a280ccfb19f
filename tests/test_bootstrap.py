"""scripts/bootstrap.sh: a failed step names its command and never leaves a ready-looking environment.

Every run here uses a throw-away environment under the test's tmp dir and a
PATH whose ``dpkg-query``, ``apt-get`` and ``sudo`` are stubs, so no test
touches the live ``.venv`` or installs Debian packages.  ``/bin/false`` as the
interpreter makes any step past the Debian packages fail at once: a broken
script fails these tests in seconds instead of building an environment.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BOOTSTRAP = REPO / "scripts" / "bootstrap.sh"

# Reports every package installed except those named in $MISSING_PACKAGES.
DPKG_QUERY = """#!/bin/sh
for pkg; do :; done  # the package is the last argument
case " $MISSING_PACKAGES " in *" $pkg "*) exit 1 ;; esac
echo 'install ok installed'
"""
# Records its arguments instead of installing anything.
APT_GET = """#!/bin/sh
echo "$*" >>"$APT_LOG"
"""
SUDO = """#!/bin/sh
exec "$@"
"""


def bootstrap(tmp_path: Path, python: str, *args: str, missing: str = "") -> subprocess.CompletedProcess:
    stubs = tmp_path / "stubs"
    if not stubs.exists():
        stubs.mkdir()
        for name, text in (("dpkg-query", DPKG_QUERY), ("apt-get", APT_GET), ("sudo", SUDO)):
            (stubs / name).write_text(text)
            (stubs / name).chmod(0o755)
    env = dict(os.environ, HVD_ELASTIC_VENV=str(tmp_path / "venv"), PYTHON=python,
               HVD_ELASTIC_WHEEL_CACHE=str(tmp_path / "wheels"), MISSING_PACKAGES=missing,
               APT_LOG=str(tmp_path / "apt.log"), PATH=f"{stubs}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run([str(BOOTSTRAP), *args], env=env, capture_output=True, text=True, timeout=300)


def apt_calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "apt.log"
    return log.read_text().splitlines() if log.exists() else []


def test_missing_interpreter_is_named(tmp_path):
    out = bootstrap(tmp_path, "python-does-not-exist")
    assert out.returncode == 1
    assert "PYTHON=python-does-not-exist not found" in out.stderr
    assert not (tmp_path / "venv").exists()


def test_failed_step_prints_its_command_and_leaves_no_ready_stamp(tmp_path):
    stamp = tmp_path / "venv" / ".hvd-elastic-ready"
    stamp.parent.mkdir()
    stamp.write_text("a digest of other inputs\n")  # stale: the script must not trust it
    out = bootstrap(tmp_path, "/bin/false")
    assert out.returncode == 1
    assert "FAILED: /bin/false -m venv" in out.stderr
    assert not stamp.exists()
    assert not (tmp_path / "wheels").exists()  # nothing was built or cached
    assert apt_calls(tmp_path) == []  # every Debian package reported installed: apt-get left alone


def test_only_missing_debian_packages_are_installed(tmp_path):
    out = bootstrap(tmp_path, "/bin/false", missing="openmpi-bin")
    assert "installing Debian packages: openmpi-bin" in out.stderr, out.stderr
    assert apt_calls(tmp_path) == ["update -qq", "install -y -qq openmpi-bin"]
    assert "FAILED: /bin/false -m venv" in out.stderr  # and it went on to the next step


def test_ready_environment_is_not_rebuilt(tmp_path):
    digest = bootstrap(tmp_path, "/bin/false", "--print-digest")
    assert digest.returncode == 0 and len(digest.stdout.strip()) == 64, digest
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".hvd-elastic-ready").write_text(digest.stdout)
    out = bootstrap(tmp_path, "/bin/false", missing="openmpi-bin")
    assert out.returncode == 0, out.stderr
    assert "is ready (inputs unchanged)" in out.stderr
    assert os.listdir(venv) == [".hvd-elastic-ready"] and apt_calls(tmp_path) == []  # nothing done
