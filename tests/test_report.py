"""``hvd-elastic report``: the timeline table, its recovery and rollback figures, bad input, the PNG.

Run directories are written here record by record, in the formats the run
decorator, the workers and the demo write (the demo's own test reports on a
real run).
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_elastic.report.summary import make_report
from hvd_elastic.report.plot import SIZE_PX
from hvd_elastic.report.runlog import read_run
from hvd_elastic.report.timeline import build

T0 = 1_800_000_000.0


def write_lines(path: Path, records: list[dict | str]) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


def event(t: float, name: str, size: int = 2, **fields) -> dict:
    return {"time": T0 + t, "event": name, "rank": 0, "size": size, "host": "localhost", "pid": 1, **fields}


def steps(t_from: float, first: int, count: int, size: int, dt: float = 0.5) -> list[dict]:
    return [{"time": T0 + t_from + i * dt, "step": first + i, "size": size, "epoch": 0,
             "loss": 2.0 - 0.01 * (first + i)}
            for i in range(count)]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """Launch at 2; a drain (2 -> 1), an add (1 -> 2), a killed worker (2 -> 1), a restart (1 -> 2).

    Steps: 1-10 at size 2; drain at t=5.2, reset at 6.0, steps 11-20 at size 1 from 6.5;
    add at 11.5, reset at 14.0, steps 21-30 at size 2 from 14.5; worker killed at 19.6
    while step 31 ran uncommitted, reset (internal error) at 22.0, steps 31-40 at size 1
    from 22.5; job killed at 27.6 after step 40, relaunched, resumed from step 35 at
    31.0, steps 36-45 at size 2 from 32.0; finished.
    """
    write_lines(tmp_path / "events.jsonl", [
        event(0.0, "start"),
        event(6.0, "reset", size=1, reason="hosts_updated", hosts="removed", old_size=2, new_size=1,
              notified_at=T0 + 5.6, interrupted_at=T0 + 5.7),
        event(14.0, "reset", size=2, reason="hosts_updated", hosts="added", old_size=1, new_size=2,
              notified_at=T0 + 11.8, interrupted_at=T0 + 11.9),
        event(22.0, "reset", size=1, reason="internal_error", old_size=2, new_size=1, interrupted_at=T0 + 21.0,
              message="HorovodInternalError: [/src/gloo/tcp.cc:81] Timed out waiting 30000ms"),
        event(31.0, "resume", size=2, path="ckpt/ckpt-00000004.json", step=35, epoch=0),
        event(31.1, "start"),
        event(37.0, "finish"),
    ])
    write_lines(tmp_path / "progress.jsonl",
                steps(0.2, 1, 10, 2) + steps(6.5, 11, 10, 1) + steps(14.5, 21, 10, 2) + steps(22.5, 31, 10, 1)
                + steps(32.0, 36, 10, 2))
    write_lines(tmp_path / "actions.jsonl", [
        {"time": T0 + 5.2, "action": "drain", "host": "127.0.0.1"},
        {"time": T0 + 11.5, "action": "add", "host": "vm"},
        {"time": T0 + 19.6, "action": "kill-worker", "host": "vm"},
        {"time": T0 + 27.6, "action": "restart", "host": None},
    ])
    return tmp_path


def test_each_change_has_its_cause_recovery_and_rollback(run_dir):
    timeline = build(read_run(run_dir))
    rows = [(c.kind, c.cause["action"], c.old_size, c.new_size, round(c.recovery_s, 1), c.rolled_back,
             round(c.pause_s, 1)) for c in timeline.changes]
    # pause: the last committed step before the interruption -> the first at the new size
    assert rows == [
        ("removed", "drain", 2, 1, 1.3, 0, 1.8),  # drain at 5.2, first step at size 1 at 6.5; last at 4.7
        ("added", "add", 1, 2, 3.0, 0, 3.5),  # 11.5 -> 14.5; last step at 11.0
        ("failure", "kill-worker", 2, 1, 2.9, 0, 3.5),  # 19.6 -> 22.5; step 31 was never committed
        ("restart", "restart", 1, 2, 4.4, 5, 5.0),  # 27.6 -> 32.0; steps 36-40 redone from the checkpoint at 35
    ]
    # Grey in the picture: gaps over 1 s and 5 median step intervals (2.5 s): all but the drain's
    assert ([(round(a - T0, 1), round(b - T0, 1)) for a, b in timeline.stalls]
            == [(11.0, 14.5), (19.0, 22.5), (27.0, 32.0)])
    assert timeline.stalled_share == pytest.approx((12.0, 36.3))
    assert timeline.finished and timeline.first_size == 2 and timeline.idle_actions == []
    assert timeline.changes[2].detail == "HorovodInternalError: Timed out waiting 30000ms"


def test_table_and_summary_text(run_dir):
    text = make_report(run_dir).text.splitlines()
    assert text[1].split() == ["t", "(s)", "cause", "change", "size", "recovery", "pause", "rolled", "back", "detail"]
    assert text[2].split() == ["0.0", "-", "launch", "-", "->", "2", "-", "-", "-"]
    assert text[3].split()[:10] == ["5.2", "drain", "127.0.0.1", "removed", "2", "->", "1", "1.3", "s", "1.8"]
    assert text[6].split()[:12] == ["27.6", "restart", "restart", "1", "->", "2", "4.4", "s", "5.0", "s", "5", "steps"]
    assert text[7].startswith("4 membership changes, longest recovery 4.4 s, 5 committed steps rolled back in all; "
                              "training finished; last committed step 45 at world size 2")
    assert text[8] == ("no step committed for 12.0 s of the 36.3 s from the first committed step to the last "
                       "(33%: the picture's grey)")


def test_without_actions_recovery_counts_from_the_notification(run_dir):
    (run_dir / "actions.jsonl").unlink()
    changes = build(read_run(run_dir)).changes
    assert [c.cause for c in changes] == [None] * 4
    assert round(changes[0].recovery_s, 1) == 0.9  # notified at 5.6, first step at size 1 at 6.5


def test_without_progress_sizes_come_from_commit_events(tmp_path):
    write_lines(tmp_path / "events.jsonl", [event(0, "start"), event(1, "commit", size=2), event(2, "commit", size=2),
                                            event(3, "reset", size=1, reason="hosts_updated", hosts="removed",
                                                  old_size=2, new_size=1), event(4, "commit", size=1)])
    report = make_report(tmp_path)
    assert report.run.sizes() == [(T0 + 1, 2), (T0 + 2, 2), (T0 + 4, 1)]
    assert report.timeline.changes[0].recovery_s == 1.0
    assert not report.ok  # no finish event yet


def test_a_run_being_written_is_read_up_to_its_last_complete_line(run_dir):
    with open(run_dir / "events.jsonl", "a") as f:
        f.write('{"time": 1800000040.0, "event": "comm')  # a writer mid-line: not a warning, not an error
    with open(run_dir / "progress.jsonl", "a") as f:
        f.write('{"time": 18000')
    run = read_run(run_dir)
    assert run.warnings == []
    assert run.events[-1]["event"] == "finish" and run.progress[-1]["step"] == 45


def test_bad_lines_are_skipped_with_a_warning_naming_file_and_line(run_dir):
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    lines.insert(2, '{"time": 18000000')  # a torn line that a later record completed
    lines.insert(3, json.dumps(event(7.0, "teleport")))
    lines.insert(4, json.dumps({"time": "soon", "event": "reset"}))
    (run_dir / "events.jsonl").write_text("\n".join(lines) + "\n")
    run = read_run(run_dir)
    path = run_dir / "events.jsonl"
    assert run.warnings[0].startswith(f"{path}:3: not a JSON object")
    assert run.warnings[1].startswith(f"{path}:4: unknown event 'teleport'")
    assert run.warnings[2] == f"{path}:5: time, new_size missing or not a number; skipped"
    assert len(build(run).changes) == 4  # the good records are all still there

    out = subprocess.run([sys.executable, "-m", "hvd_elastic.cli", "report", str(run_dir), "--no-png"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"{path}:4: unknown event 'teleport'" in out.stderr
    assert "4 membership changes" in out.stdout


@pytest.mark.parametrize("what", ["no directory", "no event log"])
def test_missing_run_dir_or_event_log_is_one_line_and_exit_2(tmp_path, what):
    target = tmp_path / "nope" if what == "no directory" else tmp_path
    out = subprocess.run([sys.executable, "-m", "hvd_elastic.cli", "report", str(target)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(target) in lines[0]
    assert ("no such directory" if what == "no directory" else "events.jsonl: missing") in lines[0]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_the_picture_is_a_png_of_the_promised_size(run_dir, tmp_path):
    target = tmp_path / "out" / "picture.png"
    target.parent.mkdir()
    out = subprocess.run([sys.executable, "-m", "hvd_elastic.cli", "report", str(run_dir), "--png", str(target)],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith(f"picture: {target}")
    assert png_size(target) == SIZE_PX


def test_exactly_once_verdict_appears_when_the_run_keeps_a_ledger(run_dir):
    (run_dir / "ledger").mkdir()
    assert make_report(run_dir).exactly_once.startswith("exactly-once: not checked yet")
    # One step of two samples, both ranks recorded, in rank 0's committed history: the epoch is complete.
    key = [0, 0, 2, 2]
    write_lines(run_dir / "ledger" / "a.jsonl",
                [{"key": key, "rank": 0, "idx": [1]}, {"key": key, "rank": 1, "idx": [0]}])
    final = {"size": 2, "checksum": "c", "scheduler": {}, "epochs": 1, "samples": 2}
    write_lines(run_dir / "final-0.json", [dict(final, rank=0, history=[key], digests=[["b", "c"]])])
    write_lines(run_dir / "final-1.json", [dict(final, rank=1, history=None)])
    report = make_report(run_dir)
    assert report.exactly_once_ok is True and report.ok
    # The same sample twice: a duplicate, and one lost.
    write_lines(run_dir / "ledger" / "a.jsonl",
                [{"key": key, "rank": 0, "idx": [1]}, {"key": key, "rank": 1, "idx": [1]}])
    report = make_report(run_dir)
    assert report.exactly_once == "exactly-once: FAILED: 1 samples lost and 1 duplicated in completed epochs"
    assert not report.ok


def test_an_empty_event_log_gets_a_table_and_a_picture(tmp_path):
    (tmp_path / "events.jsonl").write_text("")
    out = subprocess.run([sys.executable, "-m", "hvd_elastic.cli", "report", str(tmp_path)],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert "0 membership changes" in out.stdout and "not finished" in out.stdout
    assert "Warning" not in out.stderr
    assert png_size(tmp_path / "report.png") == SIZE_PX


def test_a_forked_workers_start_time_is_its_fork_to_the_clock_tick():
    # The joiner's start-up phase of the join benchmarks rests on it; psutil's create_time was 0.34 s off.
    import os
    import time

    from hvd_elastic.report.evidence import process_start

    read, write = os.pipe()
    forked_at = time.time()
    pid = os.fork()
    if pid == 0:
        os.write(write, repr(process_start()).encode())
        os._exit(0)
    os.close(write)
    reported = float(os.read(read, 64))
    os.close(read)
    os.waitpid(pid, 0)
    tick = 1 / os.sysconf("SC_CLK_TCK")
    # Never before the fork (psutil: up to 1 s before); after it by no more than a loaded scheduler adds.
    assert forked_at - tick - 0.005 <= reported <= forked_at + 1.0, (reported - forked_at)


def test_stragglers_and_each_hosts_speed_are_in_the_summary(tmp_path):
    hosts = {"localhost": {"s": 0.03, "ratio": 1.0, "ranks": 2, "slow": False},
             "127.0.0.1": {"s": 0.093, "ratio": 3.1, "ranks": 1, "slow": True}}
    write_lines(tmp_path / "events.jsonl", [
        event(0, "start", size=3), event(4, "pace", size=3, job_median_s=0.03, judged=True, hosts=hosts),
        event(8, "straggler", size=3, slow_host="127.0.0.1", ratio=3.1, host_s=0.093, job_median_s=0.03, ranks=1,
              windows=3, window=20, policy="report"),
        event(9, "pace", size=3, job_median_s=0.03, judged=True, hosts=hosts), event(10, "finish", size=3)])
    text = make_report(tmp_path).text.splitlines()
    assert text[-2:] == [
        "straggler: 127.0.0.1 at 8.0 s: 3.10x the job's median own work per step (0.0930 s vs 0.0300 s) in 3 windows "
        "of 20 commits in a row; policy report",
        "host speed in the last straggler window (1 = the job's median rank, 0.0300 s of own work per step): "
        "localhost 1.00, 127.0.0.1 0.32"]


def test_a_run_with_windows_and_no_straggler_says_so_and_one_without_windows_says_nothing(tmp_path):
    hosts = {"a": {"s": 0.03, "ratio": 1.0, "ranks": 1, "slow": False}}
    write_lines(tmp_path / "events.jsonl", [event(0, "start"), event(4, "pace", job_median_s=0.03, judged=False,
                                                                     hosts=hosts)])
    assert make_report(tmp_path).text.splitlines()[-2] == "stragglers: none"
    write_lines(tmp_path / "events.jsonl", [event(0, "start"), event(1, "finish")])
    assert not any("straggler" in line for line in make_report(tmp_path).text.splitlines())


def test_straggler_drains_are_in_the_summary_and_marked_in_the_picture(tmp_path):
    from hvd_elastic.report.summary import draw_png

    straggler = dict(size=3, slow_host="127.0.0.1", ratio=3.1, host_s=0.093, job_median_s=0.03, ranks=1, windows=3,
                     window=20, policy="drain")
    write_lines(tmp_path / "events.jsonl", [
        event(0, "start", size=3), event(8, "straggler", **straggler),
        event(8.1, "straggler_drain", size=3, slow_host="127.0.0.1", status="requested", why="figures",
              instances=["127.0.0.1/horovod"]),
        event(30, "straggler", **straggler),
        event(30.1, "straggler_drain", size=3, slow_host="127.0.0.1", status="skipped",
              why="the job would keep 2 of 3 ranks, below --min-np 3", instances=[]),
        event(40, "finish", size=3)])
    report = make_report(tmp_path)
    lines = report.text.splitlines()
    assert "straggler drain of 127.0.0.1 at 8.1 s: requested" in lines
    skipped = "straggler drain of 127.0.0.1 at 30.1 s: skipped (the job would keep 2 of 3 ranks, below --min-np 3)"
    assert skipped in lines
    assert png_size(draw_png(report)) == SIZE_PX
