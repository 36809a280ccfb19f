"""scripts/bootstrap.sh: a failed step names its command and never leaves a ready-looking environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BOOTSTRAP = REPO / "scripts" / "bootstrap.sh"


def bootstrap(tmp_path: Path, python: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HVD_ELASTIC_VENV=str(tmp_path / "venv"), PYTHON=python,
               HVD_ELASTIC_WHEEL_CACHE=str(tmp_path / "wheels"))
    return subprocess.run([str(BOOTSTRAP)], env=env, capture_output=True, text=True, timeout=300)


def test_missing_interpreter_is_named(tmp_path):
    out = bootstrap(tmp_path, "python-does-not-exist")
    assert out.returncode == 1
    assert "PYTHON=python-does-not-exist not found" in out.stderr
    assert not (tmp_path / "venv").exists()


def test_failed_step_prints_its_command_and_leaves_no_ready_stamp(tmp_path):
    out = bootstrap(tmp_path, "/bin/false")
    assert out.returncode == 1
    assert "FAILED: /bin/false -m venv" in out.stderr
    assert not (tmp_path / "venv" / ".hvd-elastic-ready").exists()
    assert not (tmp_path / "wheels").exists()  # nothing was built or cached


def test_ready_environment_is_not_rebuilt():
    # The environment running these tests was made by this script; a second run changes nothing.
    env = dict(os.environ, HVD_ELASTIC_VENV=sys.prefix)
    out = subprocess.run([str(BOOTSTRAP)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "is ready (inputs unchanged)" in out.stderr
