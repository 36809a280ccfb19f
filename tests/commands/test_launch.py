"""``hvd-elastic launch`` (:mod:`hvd_elastic.commands.launch`): horovodrun relaunched when the job dies."""

from __future__ import annotations

import signal
import subprocess
import sys

import psutil
import pytest

from testbed import HVD_ELASTIC, child_env, wait_until

# A stand-in for horovodrun: logs its attempt, then ends as told for that attempt ("0", "1", "kill", "sleep").
FAKE = '''
import os, signal, sys, time
attempt = int(os.environ["HVD_ELASTIC_LAUNCH_ATTEMPT"])
with open(sys.argv[1], "a") as f:
    f.write(f"{attempt} {os.getpid()}\\n")
plan = sys.argv[2].split(",")
what = plan[min(attempt, len(plan) - 1)]
print(f"attempt {attempt}: {what}", flush=True)
if what == "busy":  # trains: its progress file changes every 0.2 s for 3 s
    for _ in range(15):
        open(sys.argv[3], "a").write("commit\\n")
        time.sleep(0.2)
    sys.exit(0)
if what == "sleep":
    signal.signal(signal.SIGTERM, lambda *a: (print("got SIGTERM", flush=True), sys.exit(143)))
    time.sleep(60)
elif what == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
else:
    if what != "0":
        print("ERROR:root:failure count == 2 -> stop running", file=sys.stderr, flush=True)
    sys.exit(int(what))
'''


@pytest.fixture
def fake(tmp_path):
    script = tmp_path / "fake_horovodrun.py"
    script.write_text(FAKE)
    return script


def launch(fake, tmp_path, plan: str, *options: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([HVD_ELASTIC, "launch", "--restart-delay", "0", *options, "--", sys.executable, fake,
                             tmp_path / "attempts", plan, tmp_path / "progress"], env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def attempts(tmp_path) -> list[int]:
    path = tmp_path / "attempts"
    return [int(line.split()[0]) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_job_that_dies_is_relaunched_until_it_succeeds(fake, tmp_path):
    proc = launch(fake, tmp_path, "1,kill,0")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert attempts(tmp_path) == [0, 1, 2]
    assert "attempt 0: 1" in out and "attempt 2: 0" in out  # the command's stdout is ours
    assert "ERROR:root:failure count == 2 -> stop running" in err and "failure count" not in out  # its stderr too
    relaunches = [line for line in err.splitlines() if "relaunch" in line]
    assert len(relaunches) == 2, err
    assert "exited with 1 (ERROR:root:failure count == 2 -> stop running); relaunch 1 of 3" in relaunches[0]
    assert "was killed by SIGKILL" in relaunches[1] and "relaunch 2 of 3" in relaunches[1]


def test_out_of_restarts_it_exits_with_the_jobs_code(fake, tmp_path):
    proc = launch(fake, tmp_path, "3", "--max-restarts", "2")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3
    assert attempts(tmp_path) == [0, 1, 2]
    assert "no restarts left (--max-restarts 2)" in err.splitlines()[-1]


def test_a_signal_death_out_of_restarts_is_128_plus_the_signal(fake, tmp_path):
    proc = launch(fake, tmp_path, "kill", "--max-restarts", "0")
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGKILL
    assert attempts(tmp_path) == [0]


def test_a_usage_error_is_never_relaunched(fake, tmp_path):
    proc = launch(fake, tmp_path, "2")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and attempts(tmp_path) == [0]
    assert "relaunch" not in err


def test_a_job_without_progress_for_the_stall_timeout_is_ended_and_relaunched(fake, tmp_path):
    proc = launch(fake, tmp_path, "sleep,0", "--progress-file", str(tmp_path / "progress"), "--stall-timeout", "2")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert attempts(tmp_path) == [0, 1] and "got SIGTERM" in out  # the stuck one was asked to stop first
    assert f"no change in {tmp_path / 'progress'} for 2 s (--stall-timeout 2): ending the stuck job" in err, err
    assert "stuck); relaunch 1 of 3" in err, err


def test_a_job_that_makes_progress_is_left_alone(fake, tmp_path):
    proc = launch(fake, tmp_path, "busy", "--progress-file", str(tmp_path / "progress"), "--stall-timeout", "1.5")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and attempts(tmp_path) == [0], err
    assert "stuck" not in err


def test_sigterm_is_passed_on_and_nothing_is_relaunched(fake, tmp_path):
    proc = launch(fake, tmp_path, "sleep")
    wait_until("the first attempt", lambda: attempts(tmp_path), timeout=30)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert "got SIGTERM" in out
    assert proc.returncode == 143 and attempts(tmp_path) == [0], err


def test_a_killed_launcher_takes_the_job_with_it(fake, tmp_path):
    proc = launch(fake, tmp_path, "sleep")
    wait_until("the first attempt", lambda: attempts(tmp_path), timeout=30)
    child = int((tmp_path / "attempts").read_text().split()[1])
    proc.kill()
    proc.communicate(timeout=30)
    wait_until("the job to get SIGTERM and exit", lambda: not psutil.pid_exists(child)
               or psutil.Process(child).status() == psutil.STATUS_ZOMBIE, timeout=30)


@pytest.mark.parametrize("args, message", [
    ([], "no command to launch"),
    (["--max-restarts", "-1", "--", "true"], "--max-restarts: '-1' is not a whole number >= 0"),
    (["--restart-delay", "soon", "--", "true"], "--restart-delay: 'soon' is not a duration >= 0"),
    (["--stall-timeout", "1m", "--", "true"], "--stall-timeout 60s needs --progress-file PATH"),
    (["--progress-file", "p", "--", "true"], "--progress-file 'p' needs --stall-timeout DURATION"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = subprocess.run([HVD_ELASTIC, "launch", *args], env=child_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("hvd-elastic launch: error: "), result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_command_that_cannot_start_is_127(tmp_path):
    result = subprocess.run([HVD_ELASTIC, "launch", "--", str(tmp_path / "no-such-horovodrun")], env=child_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 127
    assert "cannot run" in result.stderr and "no-such-horovodrun" in result.stderr
