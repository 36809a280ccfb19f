"""CheckpointManager: atomic writes, rotation, checksums, weights_only loading, errors."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from hvd_elastic.training.checkpoint import FORMAT, WRITE_DELAY_ENV, CheckpointManager

from training_run_helpers import subprocess_env


def snapshot(step: int) -> dict:
    return {
        "model": OrderedDict(weight=torch.full((4, 3), float(step)), bias=torch.arange(3.0) + step),
        "optimizer": {"state": {0: {"exp_avg": torch.ones(4, 3) * step}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
        "values": {"step": step, "epoch": step // 10, "name": "run", "metrics": [1.5, None, True]},
    }


def assert_snapshot_equal(a, b) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_snapshot_equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_snapshot_equal(x, y)
    else:
        assert a == b


def files(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def test_save_and_load_round_trip_with_manifest(ckpt_dir):
    mgr = CheckpointManager(ckpt_dir, keep_last=3)
    assert mgr.load_latest() is None
    assert mgr.save(snapshot(5), step=5, epoch=0, commit_count=5, world_size=2)
    mgr.close()

    ckpt = CheckpointManager(ckpt_dir).load_latest()
    assert_snapshot_equal(ckpt.snapshot, snapshot(5))
    m = ckpt.manifest
    assert (m["format"], m["format_version"], m["sequence"]) == (FORMAT, 1, 1)
    assert (m["step"], m["epoch"], m["commit_count"], m["world_size"]) == (5, 0, 5, 2)
    data = ckpt.payload_path.read_bytes()
    assert m["bytes"] == len(data) and m["sha256"] == hashlib.sha256(data).hexdigest()
    assert abs(m["time"] - time.time()) < 60
    # Only final names remain: no temporary files.
    assert files(ckpt_dir) == sorted([ckpt.manifest_path.name, ckpt.payload_path.name])


def test_commit_writes_every_n_commits_from_a_private_copy(ckpt_dir):
    mgr = CheckpointManager(ckpt_dir, every_commits=3, keep_last=10)
    live = snapshot(0)
    written = []
    for step in range(1, 8):
        live["model"]["weight"].fill_(float(step))  # the committed buffer is reused
        live["values"]["step"] = step
        if mgr.commit(live, step=step):
            written.append(step)
            live["model"]["weight"].fill_(-1.0)  # overwritten as soon as commit returns
            mgr.flush()
    mgr.close()
    assert written == [3, 6]
    manifests = mgr.checkpoints()
    assert len(manifests) == 2
    ckpt = mgr.load_latest()
    assert ckpt.manifest["step"] == 6
    assert torch.equal(ckpt.snapshot["model"]["weight"], torch.full((4, 3), 6.0))
    assert ckpt.snapshot["values"]["step"] == 6


def test_with_the_committers_lock_the_copy_is_taken_in_the_writer(ckpt_dir):
    """The commit path only hands over; the writer copies under the lock, and the
    manifest describes the snapshot it actually copied."""
    lock = threading.Lock()
    committed = snapshot(1)
    mgr = CheckpointManager(ckpt_dir, every_commits=1, lock=lock,
                            describe=lambda snap: {"step": snap["values"]["step"]})
    with lock:  # the committer is busy overwriting its buffers
        assert mgr.commit(lambda: committed, step=1)  # returns at once, lock still held here
        committed["model"]["weight"].fill_(2.0)  # a later commit lands first
        committed["values"]["step"] = 2
    mgr.close()
    ckpt = mgr.load_latest()
    assert ckpt.manifest["step"] == 2
    assert torch.equal(ckpt.snapshot["model"]["weight"], torch.full((4, 3), 2.0))
    with pytest.raises(TypeError, match="callable"):
        CheckpointManager(ckpt_dir, every_commits=1, lock=lock).commit(committed)


class _Clock:
    """The checkpoint module's ``time``, with a ``monotonic()`` that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str):
        return getattr(time, name)


def test_commit_writes_by_elapsed_time(ckpt_dir, monkeypatch):
    # A clock the test moves, so the outcome does not depend on how fast this machine runs.
    clock = _Clock()
    monkeypatch.setattr("hvd_elastic.training.checkpoint.time", clock)
    mgr = CheckpointManager(ckpt_dir, every_seconds=30)
    assert not mgr.commit(snapshot(1), step=1)
    clock.now += 29.5
    assert not mgr.commit(snapshot(2), step=2)
    clock.now += 0.5
    assert mgr.commit(lambda: snapshot(3), step=3)
    mgr.flush()  # the writer is idle: only the clock decides below
    assert not mgr.commit(snapshot(4), step=4)  # the clock restarted at the write
    clock.now += 29.5
    assert not mgr.commit(snapshot(5), step=5)
    clock.now += 0.5
    assert mgr.commit(lambda: snapshot(6), step=6)
    mgr.close()
    assert [json.loads(p.read_text())["step"] for p in mgr.checkpoints()] == [6, 3]


def test_keep_last_rotation(ckpt_dir):
    mgr = CheckpointManager(ckpt_dir, every_commits=1, keep_last=2)
    for step in range(1, 6):
        assert mgr.commit(snapshot(step), step=step)
        mgr.flush()
    mgr.close()
    manifests = mgr.checkpoints()
    assert [json.loads(p.read_text())["step"] for p in manifests] == [5, 4]
    payloads = {json.loads(p.read_text())["payload"] for p in manifests}
    assert set(files(ckpt_dir)) == {p.name for p in manifests} | payloads


@pytest.mark.parametrize("damage", ["flip", "truncate", "manifest", "missing"])
def test_corrupt_newest_checkpoint_is_skipped_with_a_warning(ckpt_dir, caplog, damage):
    mgr = CheckpointManager(ckpt_dir, keep_last=5)
    mgr.save(snapshot(1), step=1)
    mgr.save(snapshot(2), step=2)
    newest = mgr.checkpoints()[0]
    payload = ckpt_dir / json.loads(newest.read_text())["payload"]
    if damage == "flip":
        data = bytearray(payload.read_bytes())
        data[len(data) // 2] ^= 0xFF
        payload.write_bytes(bytes(data))
        named = payload
    elif damage == "truncate":
        payload.write_bytes(payload.read_bytes()[: payload.stat().st_size // 2])
        named = payload
    elif damage == "manifest":
        newest.write_text(newest.read_text()[:-20])
        named = newest
    else:
        payload.unlink()
        named = payload
    events = []
    reader = CheckpointManager(ckpt_dir, on_event=lambda name, fields: events.append((name, fields)))
    with caplog.at_level(logging.WARNING, logger="hvd_elastic.training.checkpoint"):
        ckpt = reader.load_latest()
    assert ckpt.manifest["step"] == 1
    assert_snapshot_equal(ckpt.snapshot, snapshot(1))
    assert any(str(named) in r.getMessage() for r in caplog.records), caplog.text
    assert events == [("checkpoint_skipped", {"path": str(named), "reason": events[0][1]["reason"]})]


class _Planted:
    """An arbitrary object: unpickling it would create a marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_arbitrary_pickled_object_is_refused(ckpt_dir, tmp_path, caplog):
    mgr = CheckpointManager(ckpt_dir)
    mgr.save(snapshot(1), step=1)
    mgr.save(snapshot(2), step=2)
    # Replace the newest payload by one carrying an arbitrary object, with a
    # manifest that matches it, so only weights_only stands in the way.
    marker = tmp_path / "code-ran"
    newest = mgr.checkpoints()[0]
    manifest = json.loads(newest.read_text())
    payload = ckpt_dir / manifest["payload"]
    torch.save({"format": FORMAT, "version": 1, "snapshot": {"evil": _Planted(str(marker))}}, payload)
    data = payload.read_bytes()
    manifest.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    newest.write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING, logger="hvd_elastic.training.checkpoint"):
        ckpt = mgr.load_latest()
    assert not marker.exists()
    assert ckpt.manifest["step"] == 1
    assert "weights_only" in caplog.text and str(payload) in caplog.text


def test_failed_write_is_reported_and_the_last_good_checkpoint_kept(ckpt_dir, caplog):
    events = []
    mgr = CheckpointManager(ckpt_dir, every_commits=1, on_event=lambda name, fields: events.append((name, fields)))
    assert mgr.commit(snapshot(1), step=1)
    mgr.flush()
    # torch.save cannot serialise a function: the write fails in the writer thread.
    bad = snapshot(2)
    bad["values"]["callback"] = lambda: None
    with caplog.at_level(logging.ERROR, logger="hvd_elastic.training.checkpoint"):
        assert mgr.commit(bad, step=2)  # never raises into training
        mgr.flush()
    assert mgr.last_error is not None
    assert [name for name, _ in events] == ["checkpoint", "checkpoint_error"]
    assert "failed" in caplog.text
    assert mgr.load_latest().manifest["step"] == 1
    assert not [n for n in files(ckpt_dir) if n.startswith(".tmp-")]
    # The writer survives the error.
    assert mgr.commit(snapshot(3), step=3)
    mgr.close()
    assert mgr.last_error is None
    assert mgr.load_latest().manifest["step"] == 3


def test_disk_write_error_keeps_previous_checkpoint(ckpt_dir):
    """A real I/O error (EFBIG from a file-size limit) in a separate process."""
    CheckpointManager(ckpt_dir).save(snapshot(1), step=1)
    script = textwrap.dedent(f"""
        import resource, signal, sys, torch
        from hvd_elastic.training.checkpoint import CheckpointManager
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
        errors = []
        mgr = CheckpointManager({str(ckpt_dir)!r}, on_event=lambda n, f: errors.append(n))
        ok = mgr.save({{"big": torch.zeros(1 << 20)}}, step=2)
        print(ok, errors, mgr.last_error is not None)
    """)
    out = subprocess.run([sys.executable, "-c", script], env=subprocess_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # torch reports the short write as OSError or RuntimeError, depending on where it lands.
    assert out.stdout.split() == ["False", "['checkpoint_error']", "True"], out.stdout + out.stderr
    assert CheckpointManager(ckpt_dir).load_latest().manifest["step"] == 1
    assert not [n for n in files(ckpt_dir) if n.startswith(".tmp-")]


def test_interpreter_exit_finishes_the_write_in_flight(ckpt_dir):
    script = textwrap.dedent(f"""
        import torch
        from hvd_elastic.training.checkpoint import CheckpointManager
        mgr = CheckpointManager({str(ckpt_dir)!r}, every_commits=1)
        assert mgr.commit({{"w": torch.ones(10)}}, step=7)
        # no close(): the process just ends while the (slowed) write is in flight
    """)
    out = subprocess.run([sys.executable, "-c", script], env=subprocess_env(**{WRITE_DELAY_ENV: "1"}),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    ckpt = CheckpointManager(ckpt_dir).load_latest()
    assert ckpt.manifest["step"] == 7 and torch.equal(ckpt.snapshot["w"], torch.ones(10))


def test_kill_during_write_leaves_previous_checkpoint(ckpt_dir, caplog):
    """SIGKILL while the payload is in its temporary file: the old checkpoint stays
    valid and the leftovers are cleaned at the next start."""
    CheckpointManager(ckpt_dir).save(snapshot(1), step=1)
    script = textwrap.dedent(f"""
        import time, torch
        from hvd_elastic.training.checkpoint import CheckpointManager
        mgr = CheckpointManager({str(ckpt_dir)!r}, every_commits=1)
        mgr.commit({{"w": torch.ones(1000)}}, step=2)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], env=subprocess_env(**{WRITE_DELAY_ENV: "60"}))
    try:
        deadline = time.monotonic() + 60
        while not [n for n in files(ckpt_dir) if n.startswith(".tmp-")]:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    mgr = CheckpointManager(ckpt_dir)
    assert mgr.load_latest().manifest["step"] == 1
    with caplog.at_level(logging.WARNING, logger="hvd_elastic.training.checkpoint"):
        removed = mgr.remove_stale()
    assert [p.name.startswith(".tmp-") for p in removed] == [True]
    assert len(files(ckpt_dir)) == 2


def test_bad_settings_are_rejected(ckpt_dir):
    with pytest.raises(ValueError, match="every_commits"):
        CheckpointManager(ckpt_dir, every_commits=0)
    with pytest.raises(ValueError, match="every_seconds"):
        CheckpointManager(ckpt_dir, every_seconds=-1)
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointManager(ckpt_dir, keep_last=0)
