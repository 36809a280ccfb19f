"""scripts/fetch-consul.sh and fetch-prometheus.sh: the pinned binary or one line saying why not; never a wrong
or corrupt binary.

No test downloads anything: the package comes from the tool's ``*_DEB`` variable (a
local copy, as on an air-gapped machine), the binary from bootstrap's cache.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import pytest

from testbed.env import REPO, VENV_BIN


@dataclasses.dataclass(frozen=True)
class Tool:
    script: str
    name: str  # the binary DEST names, and the cache's folder under ~/.cache/hvd-elastic
    what: str
    package: str  # the .deb's stem, the cache's subfolder
    sha256_prefix: str
    version: tuple[str, ...]  # the binary's version command
    version_line: str  # what its first line starts with
    beside: tuple[str, ...] = ()  # other binaries installed next to DEST

    @property
    def env_prefix(self) -> str:
        return f"HVD_ELASTIC_{self.name.upper()}"

    def real_cache(self) -> Path:
        return Path(os.environ.get(f"{self.env_prefix}_CACHE", Path.home() / ".cache" / "hvd-elastic" / self.name))


TOOLS = [
    Tool("fetch-consul.sh", "consul", "real Consul", "consul_1.8.7+dfsg1-2+b3_amd64", "e4e888bba104daba",
         ("version",), "Consul v1.8.7"),
    Tool("fetch-prometheus.sh", "prometheus", "real Prometheus", "prometheus_2.42.0+ds-5+deb12u1_amd64",
         "81d59a24fce84f7f", ("--version",), "prometheus, version 2.42.0", beside=("promtool",)),
]


def fetch(tool: Tool, dest: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "scripts" / tool.script), str(dest)], capture_output=True, text=True,
                          timeout=120, env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), **env})


@pytest.fixture(params=TOOLS, ids=lambda t: t.name)
def tool(request) -> Tool:
    return request.param


def test_a_corrupt_package_is_one_line_and_installs_nothing(tool, tmp_path):
    cache = tmp_path / "cache" / tool.package
    cache.mkdir(parents=True)
    impostor = cache / tool.name  # a cached binary of another version is not taken either
    impostor.write_text("#!/bin/sh\necho 'some other version'\n")
    impostor.chmod(0o755)
    deb = tmp_path / "tool.deb"
    deb.write_bytes(b"not a Debian package")
    dest = tmp_path / "bin" / tool.name
    dest.parent.mkdir()
    result = fetch(tool, dest, **{f"{tool.env_prefix}_CACHE": str(tmp_path / "cache"),
                                  f"{tool.env_prefix}_DEB": str(deb)})
    assert result.returncode == 1 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "sha256" in lines[0] and tool.sha256_prefix in lines[0], result.stderr
    assert not dest.exists() and not any((dest.parent / b).exists() for b in tool.beside)
    prefix = f"{tool.script.removesuffix('.sh')}: "
    assert Path(f"{dest}.unavailable").read_text().strip() == lines[0].removeprefix(prefix)
    assert impostor.read_text().endswith("other version'\n")  # the cache is not overwritten by a bad package


def test_a_missing_local_package_or_folder_is_one_line(tool, tmp_path):
    env = {f"{tool.env_prefix}_CACHE": str(tmp_path / "empty"), f"{tool.env_prefix}_DEB": str(tmp_path / "nope.deb")}
    result = fetch(tool, tmp_path / tool.name, **env)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"{tool.script.removesuffix('.sh')}: {tool.what} unavailable: {tool.env_prefix}_DEB={tmp_path / 'nope.deb'} "
        f"is not a file"]
    result = fetch(tool, tmp_path / "no-such-folder" / tool.name, **env)
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1
    assert "no-such-folder" in result.stderr and "does not exist" in result.stderr


def test_the_cached_binary_is_installed_and_is_the_pinned_version(tool, tmp_path):
    if not (tool.real_cache() / tool.package / tool.name).exists():
        pytest.skip(f"no cached {tool.name} under {tool.real_cache()} (scripts/bootstrap.sh fetches it)")
    dest = tmp_path / tool.name
    Path(f"{dest}.unavailable").write_text("an earlier failure")
    result = fetch(tool, dest, **{f"{tool.env_prefix}_CACHE": str(tool.real_cache())})
    assert (result.returncode, result.stderr) == (0, "")
    version = subprocess.run([str(dest), *tool.version], capture_output=True, text=True, timeout=30)
    assert (version.stdout + version.stderr).splitlines()[0].startswith(tool.version_line)
    assert all((tmp_path / b).exists() for b in tool.beside)
    assert not Path(f"{dest}.unavailable").exists()
    assert (VENV_BIN / tool.name).exists(), "bootstrap installs the same binary into the venv"
