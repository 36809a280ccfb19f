"""The built wheel is the product alone, and works outside a checkout: demo, report, discovery script.

The wheel is built from a copy of the checkout and must hold the ``hvd_elastic``
package and nothing of the test bed (``testbed/``: network-namespace hosts,
sshd, fault injection, test doubles), while keeping what the demo and
``hvd-elastic report`` need.  It is installed into a throw-away virtual
environment with ``--no-deps``; torch, scikit-learn and the rest come from the
project's environment through a ``.pth`` line (its site-packages, without its
editable hook, so the installed hvd_elastic is the one imported).  Horovod's
cached wheel (what scripts/bootstrap.sh built) is installed too, for its
``horovodrun``.  Every command runs in a folder outside the checkout with no
PYTHONPATH.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from testbed import REPO, Job, child_env, start_dev_agent
from testbed.consul import register

PTH = "hvd_elastic_horovodrun.pth"
WHEEL_CACHE = Path(os.environ.get("HVD_ELASTIC_WHEEL_CACHE", Path.home() / ".cache" / "hvd-elastic" / "wheels"))
# What the checkout holds that is no source: setuptools reuses build/lib, so a module deleted since the
# last build would still be packed from there (and the build must not write into the checkout).
NOT_SOURCES = {".git", ".venv", "build", "dist", ".pytest_cache"}
#: What the demo and ``hvd-elastic report`` run on, so the wheel must carry it.
PRODUCT_MODULES = ("hvd_elastic/commands/demo.py", "hvd_elastic/demo/scenario.py", "hvd_elastic/demo/train.py",
                   "hvd_elastic/commands/report.py", "hvd_elastic/report/summary.py",
                   "hvd_elastic/report/ledger.py", "hvd_elastic/report/evidence.py", "hvd_elastic/report/jsonlines.py",
                   "hvd_elastic/local/env.py", "hvd_elastic/local/job.py", "hvd_elastic/local/realconsul.py",
                   "hvd_elastic/local/ports.py", "hvd_elastic/torchrun/plugin.py", "hvd_elastic/torchrun/handler.py")
#: The test bed's pieces (testbed/), none of which may be defined anywhere in the wheel.
TEST_BED = ("NetnsBed", "ElasticCluster", "Soak", "SlurmCluster", "Prometheus", "ScriptedServer",
            "self_signed_cert", "refused_address", "CountingProxy", "StandInJob", "StandbyProcess", "WorldSizes",
            "start_dev_agent", "host_file_discovery", "FaultyEvidence", "TrainingJob")


def run(cmd: list, *, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kwargs)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel ``pip wheel`` builds from a copy of the checkout's sources (testbed/ and tests/ included)."""
    tmp = tmp_path_factory.mktemp("wheel-build")
    source = tmp / "src"

    def ignore(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if n == "__pycache__" or n.endswith(".egg-info")
                or (Path(folder) == REPO and n in NOT_SOURCES)}

    shutil.copytree(REPO, source, ignore=ignore, symlinks=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    built = run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp / "dist", source], timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    (found,) = (tmp / "dist").glob("hvd_elastic-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The bin folder of a fresh venv holding the built wheel (and Horovod's), outside the checkout."""
    horovod = sorted(glob.glob(str(WHEEL_CACHE / "*" / "horovod-*.whl")))
    if not horovod:
        pytest.skip(f"no cached Horovod wheel under {WHEEL_CACHE} (scripts/bootstrap.sh builds it)")
    tmp = tmp_path_factory.mktemp("wheel")
    venv = tmp / "venv"
    made = run([sys.executable, "-m", "venv", "--without-pip", venv], timeout=120)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], timeout=60).stdout.strip()
    Path(purelib, "project_env.pth").write_text(sysconfig.get_path("purelib") + "\n")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    # --ignore-installed: Horovod is importable through the .pth already, but its horovodrun must land in this bin.
    got = run([*pip, "--python", python, "install", "--no-deps", "--no-index", "--ignore-installed", wheel,
               horovod[-1]], timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    return venv / "bin"


def test_the_wheel_ships_the_product_and_no_test_bed(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        sources = {name: archive.read(name).decode() for name in names if name.endswith(".py")}
    tops = {name.split("/", 1)[0] for name in names}
    assert {t for t in tops if not re.fullmatch(r"hvd_elastic(-[^/]+\.(dist-info|data))?", t)} == {PTH}, tops
    with zipfile.ZipFile(wheel) as archive:  # horovodrun's driver rules load through it (setup.py)
        assert archive.read(PTH) == (REPO / PTH).read_bytes()
    assert [n for n in names if "testbed" in n or n.startswith("tests/")] == []
    assert [m for m in PRODUCT_MODULES if m not in names] == []
    with zipfile.ZipFile(wheel) as archive:  # torchrun --rdzv-backend consul finds the backend through it
        entry_points = next(archive.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "[torchrun.handlers]\nconsul = hvd_elastic.torchrun.plugin:handler_creator" in entry_points
    defined = re.compile(rf"^\s*(?:class|def)\s+({'|'.join(TEST_BED)})\b", re.MULTILINE)
    found = {name: defined.findall(text) for name, text in sources.items() if defined.search(text)}
    assert found == {}, f"test-bed code in the wheel: {found}"
    # Nothing shipped names the test bed's modules (a preload list, a ``python -m`` of its worker).
    assert [name for name, text in sources.items() if re.search(r"\btestbed\.\w", text)] == []


def test_the_wheel_carries_the_license(wheel):
    """setup.cfg says Apache-2.0: the text itself travels in the wheel's metadata (License-File)."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        fields = archive.read(metadata).decode()
        (licence,) = [n for n in names if re.fullmatch(r"hvd_elastic-[^/]+\.dist-info/(licenses/)?LICENSE", n)]
        assert archive.read(licence) == (REPO / "LICENSE").read_bytes()
    assert "License-File: LICENSE" in fields and "Apache License" in (REPO / "LICENSE").read_text()


def test_the_wheel_ships_the_examples_and_the_discovery_contract(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        share = next(n.split("share/hvd-elastic/")[0] for n in names if "/share/hvd-elastic/" in n)
        share += "share/hvd-elastic/"
        for shipped, source in (("examples/minimal.py", "examples/minimal.py"),
                                ("examples/train_elastic.py", "examples/train_elastic.py"),
                                ("discovery/README.md", "discovery/README.md")):
            assert share + shipped in names, shipped
            assert archive.read(share + shipped) == (REPO / source).read_bytes(), shipped


def test_the_installed_discovery_script_starts_python_isolated(wheel, tmp_path):
    """pip rewrites a ``#!python -I -S`` first line to the bare interpreter, dropping the flags discovery's
    start-up rests on; the script starts Python with them itself.  A ``sitecustomize`` on PYTHONPATH is what
    a Python started without -I (PYTHONPATH) and -S (site) would run."""
    venv = tmp_path / "venv"
    assert run([sys.executable, "-m", "venv", "--without-pip", venv], timeout=120).returncode == 0
    got = run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", venv / "bin" / "python",
               "install", "--no-deps", "--no-index", wheel], timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    probe, marker = tmp_path / "probe", tmp_path / "site-was-read"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    out = run([venv / "bin" / "consul_hosts", "--help"], timeout=120, cwd=tmp_path,
              env=outside_env(PYTHONPATH=str(probe)))
    assert out.returncode == 0 and out.stdout.startswith("usage: consul_hosts"), out.stderr
    assert not marker.exists(), "consul_hosts ran without -I -S"


def outside_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return dict(env, **extra)


@pytest.mark.slow
def test_installed_copy_is_the_one_imported_and_has_every_command(installed, tmp_path):
    out = run([installed / "python", "-c", "import hvd_elastic.demo.train, hvd_elastic; print(hvd_elastic.__file__)"],
              timeout=120, cwd=tmp_path, env=outside_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(str(installed.parent)), out.stdout
    # The demo's children import the installed package: nothing puts a checkout (or site-packages) on
    # PYTHONPATH for them, and the test bed is not there to import.
    probe = ("import hvd_elastic.local.env as e, importlib.util as u; "
             "print(e.child_env(scrub=False).get('PYTHONPATH'), u.find_spec('testbed'))")
    out = run([installed / "python", "-c", probe], timeout=120, cwd=tmp_path, env=outside_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "None"], out.stdout
    for command in (["hvd-elastic", "demo", "--help"], ["hvd-elastic", "report", "--help"], ["consul_hosts", "--help"]):
        out = run([installed / command[0], *command[1:]], timeout=120, cwd=tmp_path, env=outside_env())
        assert out.returncode == 0, (command, out.stderr)
        assert out.stdout.startswith("usage:")


@pytest.mark.slow
def test_installed_discovery_script_prints_healthy_hosts(installed, tmp_path):
    agent, addrs = start_dev_agent(["gpu-a", "gpu-b"], env=child_env(), logdir=tmp_path)
    with agent:
        register(addrs["gpu-a"], slots="4")
        register(addrs["gpu-b"], slots="2", status="critical")
        state = tmp_path / "state"
        state.mkdir(mode=0o700)
        out = run([installed / "consul_hosts"], timeout=60, cwd=tmp_path, start_new_session=True,
                  env=outside_env(CONSUL_HTTP_ADDR=addrs["gpu-a"], HVD_ELASTIC_DISCOVERY_STATE_DIR=str(state)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["gpu-a:4"]


@pytest.mark.slow
def test_installed_demo_smallest_setting_and_report(installed, tmp_path):
    work = tmp_path / "run"
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    # A Job, so the demo and everything it starts die with the test on any outcome.
    with Job([installed / "hvd-elastic", "demo", "--workdir", work, "--events", "drain", "--epochs", "1",
              "--phase-steps", "4", "--timeout", "150"], env=outside_env(HVD_ELASTIC_DISCOVERY_STATE_DIR=str(state)),
             logdir=tmp_path, cwd=tmp_path, name="installed-demo") as demo:
        demo.start()
        demo.finish(timeout=480)
        output = demo.read_log()
    assert "demo OK" in output and "exactly-once: OK" in output
    assert "drain 127.0.0.1" in output
    out = run([installed / "hvd-elastic", "report", work], timeout=180, cwd=tmp_path, env=outside_env())
    assert out.returncode == 0, out.stderr
    assert "1 membership change," in out.stdout and (work / "report.png").stat().st_size > 10_000


@pytest.mark.slow
@pytest.mark.slow
def test_installed_horovodrun_loads_hvd_elastics_driver_rules(installed, tmp_path):
    """The wheel's .pth puts the finder in place, and horovodrun's launcher module gets the rules."""
    probe = ("import sys, horovod.runner.gloo_run as g, hvd_elastic.horovodrun.rules as r; "
             "print(g._hvd_elastic_rules, r.__file__)")
    out = run([installed / "python", "-c", probe], timeout=120, cwd=tmp_path, env=outside_env())
    assert out.returncode == 0, out.stderr
    flag, source = out.stdout.split()
    assert flag == "True" and source.startswith(str(installed.parent)), out.stdout


def test_installed_package_carries_the_operator_files(installed):
    share = installed.parent / "share" / "hvd-elastic"
    for name in ("systemd/hvd-elastic-node-agent.service", "systemd/hvd-elastic-discover.service",
                 "systemd/hvd-elastic-standby@.service",
                 "slurm/prolog.sh", "slurm/epilog.sh", "slurm/launcher.sbatch", "slurm/worker.sbatch",
                 "slurm/README.md", "consul/horovod.hcl", "grafana/hvd-elastic-job.json"):
        assert (share / name).read_bytes() == (REPO / "scripts" / name).read_bytes(), name
