"""horovodrun's start-up costs, cut (:mod:`hvd_elastic.horovodrun.startup`): unit tests, then real horovodruns."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hvd_elastic.discovery import reaper
from hvd_elastic.horovodrun import startup
from testbed import VENV_BIN, child_env

CHECKING = "Checking whether extension"  # what Horovod's own Gloo check prints under --verbose


def counting(answer):
    calls = []

    def check(*args, **kwargs):
        calls.append((args, kwargs))
        return answer

    return check, calls


def test_a_yes_is_kept_and_answers_the_next_check(tmp_path):
    check, calls = counting(True)
    marker = tmp_path / "cache" / "gloo-yes"
    cached = startup.remembered(check, lambda: marker)
    assert cached(verbose=False) is True and marker.exists()
    assert cached(verbose=False) is True
    assert len(calls) == 1


@pytest.mark.parametrize("answer", [False, None])
def test_a_no_is_never_kept(tmp_path, answer):
    check, calls = counting(answer)
    marker = tmp_path / "gloo-yes"
    cached = startup.remembered(check, lambda: marker)
    assert cached() is answer and cached() is answer
    assert len(calls) == 2 and not marker.exists()


def test_an_unwritable_cache_still_answers(tmp_path):
    (tmp_path / "file").write_text("")
    check, calls = counting(True)
    cached = startup.remembered(check, lambda: tmp_path / "file" / "gloo-yes")  # a file where the folder goes
    assert cached() is True and cached() is True
    assert len(calls) == 2


def test_the_key_changes_with_an_extension_library_and_the_version(tmp_path):
    library = tmp_path / "torch" / "mpi_lib_v2.so"
    library.parent.mkdir()
    library.write_bytes(b"one")
    first = startup.build_key(tmp_path, "0.28.1")
    assert startup.build_key(tmp_path, "0.28.1") == first
    assert startup.build_key(tmp_path, "0.28.2") != first
    library.write_bytes(b"rebuilt")
    assert startup.build_key(tmp_path, "0.28.1") != first


def test_the_cache_folder_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv(startup.CACHE_ENV, str(tmp_path))
    assert startup.cache_dir() == tmp_path / "hvd-elastic"
    monkeypatch.delenv(startup.CACHE_ENV)
    assert startup.cache_dir() == Path.home() / ".cache" / "hvd-elastic"


# -- real horovodruns ----------------------------------------------------------------------------------------

# The worker: which of its ancestors made it.  A forkserver's children keep the server's command line.
ANCESTRY = ("import psutil, sys; p = psutil.Process().parent(); seen = []\n"
            "while p is not None: seen.append(' '.join(p.cmdline())); p = p.parent()\n"
            "open(sys.argv[1], 'w').write('\\n'.join(seen))")


def horovodrun_command(tmp_path: Path, *command: str, verbose: bool = False, discovery: str = "") -> list[str]:
    """A one-host elastic horovodrun of ``command``; its discovery script runs ``discovery`` (shell), then
    prints the host."""
    script = tmp_path / "hosts.sh"
    script.write_text(f"#!/bin/sh\n{discovery}\necho localhost:1\n")
    script.chmod(0o755)
    return [str(VENV_BIN / "horovodrun"), "-np", "1", "--min-np", "1", "--max-np", "1", "--network-interface", "lo",
            "--host-discovery-script", str(script), *(["--verbose"] if verbose else []), *command]


def horovodrun(tmp_path: Path, *command: str, verbose: bool = False, **env: str) -> subprocess.CompletedProcess:
    """:func:`horovodrun_command`, run to its end; its output."""
    return subprocess.run(horovodrun_command(tmp_path, *command, verbose=verbose),
                          env=child_env(XDG_CACHE_HOME=str(tmp_path / "cache"), **env), capture_output=True,
                          text=True, timeout=120)


@pytest.mark.slow
def test_horovodrun_asks_about_gloo_once(tmp_path):
    first = horovodrun(tmp_path, "true", verbose=True)
    assert first.returncode == 0, first.stdout + first.stderr
    assert CHECKING in first.stdout + first.stderr
    assert [p.name for p in (tmp_path / "cache" / "hvd-elastic").iterdir()][0].startswith("horovod-gloo-")
    second = horovodrun(tmp_path, "true", verbose=True)
    assert second.returncode == 0, second.stdout + second.stderr
    assert CHECKING not in second.stdout + second.stderr
    off = horovodrun(tmp_path, "true", verbose=True, HVD_ELASTIC_DRIVER="0")  # no hook: Horovod's own check
    assert off.returncode == 0 and CHECKING in off.stdout + off.stderr


@pytest.mark.slow
@pytest.mark.parametrize("rules, made_by", [("1", "multiprocessing.forkserver"), ("0", "multiprocessing.spawn")])
def test_workers_start_through_a_forkserver_under_the_rules(tmp_path, rules, made_by):
    ancestry = tmp_path / "ancestry"
    run = horovodrun(tmp_path, str(VENV_BIN / "python"), "-c", ANCESTRY, str(ancestry), HVD_ELASTIC_DRIVER=rules)
    assert run.returncode == 0, run.stdout + run.stderr
    ancestors = ancestry.read_text().splitlines()
    middleman = next(line for line in ancestors if "multiprocessing" in line)
    assert made_by in middleman, ancestors


@pytest.mark.slow
@pytest.mark.parametrize("rules", ["1", "0"])
def test_discoverys_reaper_finds_the_worker_sessions_either_way(tmp_path, rules):
    """The reaper ends a lost host's sessions by finding them under horovodrun: with the rules they are
    the forkserver's children, not horovodrun's (a partitioned host's ssh then waited out TCP's connect
    timeout, 130 s, in the 200-fault soak)."""
    job = subprocess.Popen(horovodrun_command(tmp_path, "sleep", "60"), start_new_session=True,
                           env=child_env(XDG_CACHE_HOME=str(tmp_path / "cache"), HVD_ELASTIC_DRIVER=rules),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (sessions := reaper.worker_sessions(job.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(sessions) == ["localhost"] and len(sessions["localhost"]) == 1
        assert reaper.end_sessions(sessions["localhost"]) == sessions["localhost"]
        while set(sessions["localhost"]) & set(reaper.worker_sessions(job.pid).get("localhost", ())):
            assert time.monotonic() < deadline, "the ended session is still there"
            time.sleep(0.1)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


@pytest.mark.slow
@pytest.mark.parametrize("rules", ["1", "0"])
def test_discovery_knows_its_horovodrun_either_way(tmp_path, rules):
    """Discovery keys its job's cache, watcher and reaper by the horovodrun above its session; with the rules
    a forkserver stands between them (without it, discovery under the rules ran with no watcher at all)."""
    seen = tmp_path / "job"
    record = (f"{VENV_BIN / 'python'} -c 'from hvd_elastic.discovery import jobdir; "
              f"open(\"{seen}\", \"w\").write(str(jobdir.job_process()[0]))'")
    job = subprocess.Popen(horovodrun_command(tmp_path, "true", discovery=record),
                           env=child_env(XDG_CACHE_HOME=str(tmp_path / "cache"), HVD_ELASTIC_DRIVER=rules),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert job.wait(timeout=120) == 0
    assert int(seen.read_text()) == job.pid
