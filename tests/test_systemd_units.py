"""The shipped systemd units (scripts/systemd) are ones systemd accepts: ``systemd-analyze verify``, as on a node.

Each unit is copied with ``/opt/hvd-elastic/.venv`` (the documented install
prefix) pointing at this checkout's venv, so the commands it runs exist; a
template is verified as an instance for root.  Any complaint (an unknown key,
a value systemd cannot parse, a missing program) fails.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from testbed import REPO, VENV_BIN

UNITS = sorted((REPO / "scripts" / "systemd").glob("*.service"))
PREFIX = "/opt/hvd-elastic/.venv/bin"


def test_every_unit_is_checked():
    assert {u.name for u in UNITS} >= {"hvd-elastic-node-agent.service", "hvd-elastic-discover.service",
                                       "hvd-elastic-standby@.service"}


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_systemd_accepts_the_unit(unit, tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("no systemd-analyze on this machine")
    text = unit.read_text()
    assert PREFIX in text, f"{unit.name} does not run from the documented prefix {PREFIX}"
    (tmp_path / unit.name).write_text(text.replace(PREFIX, str(VENV_BIN)))
    name = unit.name.replace("@.", "@root.")
    result = subprocess.run([analyze, "verify", str(tmp_path / name)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


def test_a_unit_systemd_rejects_fails_the_check(tmp_path):
    """The check can fail: an unparsable service type is reported."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("no systemd-analyze on this machine")
    bad = tmp_path / "hvd-elastic-bad.service"
    bad.write_text(f"[Service]\nType=notifyish\nExecStart={VENV_BIN / 'hvd-elastic'} standby\n")
    result = subprocess.run([analyze, "verify", str(bad)], capture_output=True, text=True, timeout=120)
    assert "Failed to parse service type" in result.stderr


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_each_unit_says_its_install_path_is_an_assumption_and_how_to_change_it(unit):
    lines = unit.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ExecStart="))
    above = "\n".join(lines[max(0, start - 6):start])
    assert "# The path below is an assumption: hvd-elastic installed in the virtual environment" in above, above
    arguments = lines[start].removeprefix(f"ExecStart={PREFIX}/hvd-elastic")
    assert "systemctl edit" in above and f"#   ExecStart=/your/prefix/bin/hvd-elastic{arguments}" in above, above
