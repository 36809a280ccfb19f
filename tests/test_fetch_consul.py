"""scripts/fetch-consul.sh: Consul 1.8.7 or one line saying why not; never a wrong or corrupt binary.

No test downloads anything: the package comes from HVD_ELASTIC_CONSUL_DEB (a
local copy, as on an air-gapped machine), the binary from bootstrap's cache.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hvd_elastic.testbed.env import REPO
from hvd_elastic.testbed.realconsul import CONSUL

FETCH = REPO / "scripts" / "fetch-consul.sh"
REAL_CACHE = Path(os.environ.get("HVD_ELASTIC_CONSUL_CACHE", Path.home() / ".cache" / "hvd-elastic" / "consul"))


def fetch(dest: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(FETCH), str(dest)], capture_output=True, text=True, timeout=120,
                          env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), **env})


def test_a_corrupt_package_is_one_line_and_installs_nothing(tmp_path):
    cache = tmp_path / "cache" / "consul_1.8.7+dfsg1-2+b3_amd64"
    cache.mkdir(parents=True)
    impostor = cache / "consul"  # a cached binary of another version is not taken either
    impostor.write_text("#!/bin/sh\necho 'Consul v1.9.0'\n")
    impostor.chmod(0o755)
    deb = tmp_path / "consul.deb"
    deb.write_bytes(b"not a Debian package")
    dest = tmp_path / "bin" / "consul"
    dest.parent.mkdir()
    result = fetch(dest, HVD_ELASTIC_CONSUL_CACHE=str(tmp_path / "cache"), HVD_ELASTIC_CONSUL_DEB=str(deb))
    assert result.returncode == 1 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "sha256" in lines[0] and "e4e888bba104daba" in lines[0], result.stderr
    assert not dest.exists()
    assert Path(f"{dest}.unavailable").read_text().strip() == lines[0].removeprefix("fetch-consul: ")
    assert impostor.read_text().endswith("v1.9.0'\n")  # the cache is not overwritten by a bad package


def test_a_missing_local_package_is_one_line(tmp_path):
    result = fetch(tmp_path / "consul", HVD_ELASTIC_CONSUL_CACHE=str(tmp_path / "empty"),
                   HVD_ELASTIC_CONSUL_DEB=str(tmp_path / "nope.deb"))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"fetch-consul: real Consul unavailable: HVD_ELASTIC_CONSUL_DEB={tmp_path / 'nope.deb'} is not a file"]


def test_the_cached_binary_is_installed_and_is_consul_1_8_7(tmp_path):
    if not (REAL_CACHE / "consul_1.8.7+dfsg1-2+b3_amd64" / "consul").exists():
        pytest.skip(f"no cached Consul under {REAL_CACHE} (scripts/bootstrap.sh fetches it)")
    dest = tmp_path / "consul"
    Path(f"{dest}.unavailable").write_text("an earlier failure")
    result = fetch(dest, HVD_ELASTIC_CONSUL_CACHE=str(REAL_CACHE))
    assert (result.returncode, result.stderr) == (0, "")
    version = subprocess.run([str(dest), "version"], capture_output=True, text=True, timeout=30).stdout
    assert version.splitlines()[0] == "Consul v1.8.7"
    assert not Path(f"{dest}.unavailable").exists()
    assert CONSUL.exists(), "bootstrap installs the same binary into the venv"
