"""The README's main command: the elastic demo, end to end, through real processes; and its schedule checks."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys

import psutil
import pytest

from hvd_elastic.demo import schedule
from hvd_elastic.demo.digits import TEST_SAMPLES
from hvd_elastic.demo.live import Console
from hvd_elastic.report.plot import SIZE_PX
from testbed import JobError, JsonLines, wait_until
from hvd_elastic.report.ledger import verdict
from hvd_elastic.training.events import EventLog

# Below pytest's own 600 s timeout (pyproject.toml), so that on a hang this test,
# not pytest, stops the demo and everything it started.
DEMO_WAIT_S = 540
# Each demo phase's own limit (a phase: one event and the steps after it), so that
# a stuck phase is reported by the demo, naming it.  Not a speed requirement.
PHASE_TIMEOUT_S = 120
# Inherited by every process the demo starts (node agents, horovodrun, its
# workers and discovery calls), so even those that left the demo's process tree
# are found.  Also keeps discovery's first-call markers in this test's tmp dir.
MARKER = "HVD_ELASTIC_DISCOVERY_STATE_DIR"


def _started_by(proc: subprocess.Popen, marker: str) -> list[psutil.Process]:
    found = {}
    try:
        found.update((p.pid, p) for p in psutil.Process(proc.pid).children(recursive=True))
    except psutil.NoSuchProcess:
        pass
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARKER) == marker:
                found[p.pid] = p
        except psutil.Error:  # gone, a zombie, or not ours to read
            continue
    found.pop(os.getpid(), None)
    return list(found.values())


def _reap(proc: subprocess.Popen, marker: str, grace: float) -> list[str]:
    """Give the demo's processes ``grace`` seconds to end, then SIGKILL the rest; their command lines."""
    procs = _started_by(proc, marker)
    _, alive = psutil.wait_procs(procs, timeout=grace)
    lingering = []
    for p in alive:
        try:
            lingering.append(" ".join(p.cmdline())[:200])
            p.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(alive, timeout=10)
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    return lingering


def start_demo(*args: str, marker: str, log_path) -> subprocess.Popen:
    with open(log_path, "w") as log:
        return subprocess.Popen([sys.executable, "-m", "hvd_elastic.cli", "demo", *args], stdout=log,
                                stderr=subprocess.STDOUT, env=dict(os.environ, **{MARKER: marker}),
                                start_new_session=True)


def run_demo(*args: str, marker: str, log_path, wait: float = DEMO_WAIT_S,
             interrupt_after: str | None = None) -> tuple[int | None, list[str]]:
    """Run ``hvd-elastic demo *args``: (its exit code or None when it hung and was killed, processes it left).

    With ``interrupt_after``, the demo gets SIGTERM once its output shows that text.
    """
    proc = start_demo(*args, marker=marker, log_path=log_path)
    code = None
    try:
        if interrupt_after is not None:
            wait_until(f"the demo to print {interrupt_after!r}",
                       lambda: proc.poll() is not None or interrupt_after in log_path.read_text(), wait, 0.5)
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=wait)
    except (subprocess.TimeoutExpired, JobError):
        pass
    finally:
        # A finished demo must have ended what it started: a short grace, then anything left is a leak.
        lingering = _reap(proc, marker, grace=10 if code is not None else 0)
    return code, lingering


@pytest.mark.slow
def test_demo_goes_through_every_event_and_every_check_holds(tmp_path, consul_kind):
    marker = str(tmp_path / "discovery-state")
    work = tmp_path / "work"
    code, lingering = run_demo("--workdir", str(work), "--epochs", "3", "--phase-steps", "4", "--step-delay", "0.25",
                               "--timeout", str(PHASE_TIMEOUT_S), "--consul", consul_kind, marker=marker,
                               log_path=tmp_path / "demo.log")
    output = (tmp_path / "demo.log").read_text()
    assert code is not None, f"demo still running after {DEMO_WAIT_S}s (killed):\n{output[-3000:]}"
    assert code == 0, output[-6000:]
    assert "demo OK" in output
    assert ("Consul: HashiCorp Consul" if consul_kind == "consul" else "Consul: the embedded dev agent") in output
    assert not lingering, f"processes left running after the demo exited: {lingering}"
    assert "\r" not in output  # no live status line when stdout is not a terminal

    # Every kind of change happened, in the schedule's order, and the relaunch resumed from a checkpoint.
    events = EventLog.read(work / "events.jsonl")
    kinds = [e.get("hosts", e["reason"]) if e["event"] == "reset" else e["event"]
             for e in events if e["event"] in ("reset", "resume")]
    # The killed worker's host rejoins after its cooldown (hvd_elastic.horovodrun): the "added" after the failure.
    assert kinds == ["removed", "added", "added", "internal_error", "added", "removed", "resume"], kinds
    # The drain was graceful: nothing was rolled back before the growth.
    before_growth = events[: next(i for i, e in enumerate(events) if e.get("hosts") == "added")]
    assert not any(e["event"] == "restore" for e in before_growth)
    assert next(e for e in events if e["event"] == "resume")["step"] > 0
    assert events[-1]["event"] == "finish"

    # The summary: one row per event with its recovery, the two checks, the files.
    for action in ("drain 127.0.0.1", "undrain 127.0.0.1", "add \\S+", "kill-worker \\S+", "ttl 127.0.0.1", "restart"):
        row = re.compile(rf"^ *\d+\.\d  {action} +\w+ +\d -> \d +\d+\.\d s +\d+\.\d s +\d+ steps", re.MULTILINE)
        assert row.search(output), f"no summary row with a recovery time and pause for {action}:\n{output[-4000:]}"
    assert re.search(r"^no step committed for \d+\.\d s of the \d+\.\d s .*\(\d+%: the picture's grey\)$", output,
                     re.MULTILINE), output[-4000:]
    assert re.search(r"standby demo-\d+ ready", output)  # the default: workers forked from a warm standby
    assert "exactly-once: OK" in output
    assert f"accuracy on {TEST_SAMPLES} held-out digits" in output and "): OK" in output
    # Checked again here, not only by the demo: every sample once per epoch, ranks identical.
    assert verdict(work).problems() == []
    assert json.loads((work / "result.json").read_text())["accuracy"] > 0.5
    png = work / "report.png"
    assert f"picture: {png}" in output
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert tuple(int.from_bytes(data[i:i + 4], "big") for i in (16, 20)) == SIZE_PX

    # The report of this e2e run, on its own.
    out = subprocess.run([sys.executable, "-m", "hvd_elastic.cli", "report", str(work), "--no-png"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "7 membership changes" in out.stdout and "exactly-once: OK" in out.stdout
    # Discovery kept its first-call markers here, not in a shared /tmp path.
    assert os.listdir(marker)


@pytest.mark.slow
def test_sigterm_mid_training_ends_every_process_the_demo_started(tmp_path):
    marker = str(tmp_path / "discovery-state")
    log_path = tmp_path / "demo.log"
    code, lingering = run_demo("--workdir", str(tmp_path / "work"), "--timeout", str(PHASE_TIMEOUT_S), marker=marker,
                               log_path=log_path, interrupt_after="training at world size 2")
    output = log_path.read_text()
    assert "training at world size 2" in output, output[-3000:]
    assert code == 130, output[-3000:]  # interrupted, like Ctrl-C
    assert not lingering, f"processes left running after the demo was stopped: {lingering}"


@pytest.mark.parametrize("flags, message", [
    (["--events", "drain:127.0.0.1,drain:localhost"], "--events step 2 (drain:localhost): would leave 0 worker(s)"),
    (["--events", "drain,explode"], "--events: unknown action 'explode'"),
    (["--events", "undrain"], "--events step 1 (undrain): no host to undrain"),
    (["--events", "drain:gpu-z"], "unknown host 'gpu-z'"),
    (["--events", "ttl,restart"], "only 1 healthy host(s) left; elastic horovodrun needs 2 to start"),
    (["--spare-host", "localhost"], "--spare-host 'localhost': expected a host name"),
    (["--epochs", "1", "--phase-steps", "20"], "but --epochs 1 trains 45; raise --epochs"),
])
def test_impossible_schedules_are_refused_before_anything_starts(tmp_path, flags, message):
    out = subprocess.run([sys.executable, "-m", "hvd_elastic.cli", "demo", "--workdir", str(tmp_path / "w"), *flags],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and message in out.stderr, out.stderr
    assert not (tmp_path / "w").exists()


def test_plan_picks_hosts_and_sizes():
    events = schedule.plan(schedule.parse(schedule.DEFAULT), ["localhost", "127.0.0.1"], ["spare"])
    assert [(e.action, e.host, e.size_after) for e in events] == [
        ("drain", "127.0.0.1", 1), ("undrain", "127.0.0.1", 2), ("add", "spare", 3),
        ("kill-worker", "spare", 3), ("ttl", "127.0.0.1", 2), ("restart", None, 2)]
    # A host whose worker was killed rejoins after its cooldown (hvd_elastic.horovodrun): it can be drained then.
    events = schedule.plan(schedule.parse("add,kill-worker,drain:spare"), ["localhost", "127.0.0.1"], ["spare"])
    assert [(e.action, e.host, e.size_after) for e in events] == [
        ("add", "spare", 3), ("kill-worker", "spare", 3), ("drain", "spare", 2)]


class _Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_status_line_on_a_terminal_only(tmp_path):
    progress = tmp_path / "progress.jsonl"
    progress.write_text(json.dumps({"time": 1.0, "step": 3, "size": 2, "epoch": 0, "loss": 1.5}) + "\n")
    for tty in (True, False):
        stream = _Stream(tty)
        console = Console(JsonLines(progress), stream)
        console.refresh()
        console.refresh()  # unchanged: not drawn again
        console.say("drained", event="drain 127.0.0.1")
        console.refresh()
        lines = stream.getvalue()
        if tty:
            assert lines.count("\r\x1b[K  step    3  epoch 0  world size 2  loss 1.5000  last event: -") == 1
            assert lines.endswith("last event: drain 127.0.0.1")
            assert "\r\x1b[K[demo " in lines  # the event line first clears the status line
        else:
            assert "\r" not in lines and lines.strip().endswith("drained") and lines.count("\n") == 1


@pytest.mark.parametrize("choice, reason, kind", [
    ("auto", None, "consul"), ("auto", "no binary", "dev"), ("dev", None, "dev"), ("consul", None, "consul"),
])
def test_consul_choice(monkeypatch, choice, reason, kind):
    from hvd_elastic.demo import scenario as command

    monkeypatch.setattr(command, "unavailable_reason", lambda: reason)
    assert command.consul_kind(choice) == kind


def test_consul_consul_without_the_binary_is_refused_naming_why(monkeypatch):
    from hvd_elastic.demo import scenario as command

    monkeypatch.setattr(command, "unavailable_reason", lambda: "no real Consul at .venv/bin/consul")
    with pytest.raises(ValueError, match="--consul consul: no real Consul at .venv/bin/consul"):
        command.consul_kind("consul")
