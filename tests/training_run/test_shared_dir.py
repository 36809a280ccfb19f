"""The shared-checkpoint-directory check in one process: markers, the refusal, the switch, the runner's order.

The check across real ranks and hosts is in test_shared_dir_jobs.py (horovodrun on localhost and
127.0.0.1) and tests/multihost/test_shared_checkpoint_dir.py (netns hosts over ssh).
"""

from __future__ import annotations

import threading

import pytest
import torch

import horovod.torch as hvd

from hvd_elastic.training import runner
from hvd_elastic.training._internal import shared_dir
from hvd_elastic.training.checkpoint import CheckpointManager
from hvd_elastic.training.runner import RunConfig, run
from hvd_elastic.training.state import TrainingState


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvd.init()
    yield


def listing(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_a_marker_is_seen_where_it_was_written_and_nowhere_else(tmp_path):
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    marker = shared_dir.write_marker(here)
    assert marker.path.parent == here and shared_dir.is_marker(marker.name)
    assert marker.path.read_text() == marker.nonce and len(marker.nonce) == 32
    assert marker.seen_in(here) is None
    assert marker.seen_in(elsewhere) == "no such file"
    (elsewhere / marker.name).write_text("0" * 32)
    assert marker.seen_in(elsewhere) == "a different file under the marker's name"
    marker.remove()
    marker.remove()  # idempotent
    assert listing(here) == []


def test_a_marker_that_shows_up_late_is_seen_within_the_settle_time(tmp_path):
    marker = shared_dir.write_marker(tmp_path)
    late = tmp_path / "late"
    late.mkdir()
    timer = threading.Timer(0.3, lambda: (late / marker.name).write_text(marker.nonce))
    timer.start()
    try:
        assert marker.seen_in(late, settle=0.0) == "no such file"
        assert marker.seen_in(late, settle=5.0) is None
    finally:
        timer.cancel()


def test_markers_are_no_checkpoints_and_only_markers_are_swept(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(lambda: {"x": torch.ones(2)}, step=1)
    marker = shared_dir.write_marker(tmp_path)
    assert [p.name for p in manager.checkpoints()] == ["ckpt-00000001.json"]
    assert manager.remove_stale() == []  # not an interrupted write's leftover either
    assert torch.equal(manager.load_latest().snapshot["x"], torch.ones(2))
    assert shared_dir.remove_markers(tmp_path) == [marker.path]
    assert not any(shared_dir.is_marker(name) for name in listing(tmp_path))
    assert len(manager.checkpoints()) == 1
    manager.close()


def test_host_label_adds_horovods_name_where_it_differs(monkeypatch):
    import socket

    monkeypatch.setenv("HOROVOD_HOSTNAME", socket.gethostname())
    assert shared_dir.host_label() == socket.gethostname()
    monkeypatch.setenv("HOROVOD_HOSTNAME", "127.0.0.1")
    assert shared_dir.host_label() == f"{socket.gethostname()} as 127.0.0.1"


def test_the_refusal_is_one_line_naming_directory_hosts_reasons_and_the_override():
    reports = [(0, "gpu-a", None), (3, "gpu-c", "no such file"), (1, "gpu-b", "no such file"),
               (2, "gpu-b", "unreadable: PermissionError: Permission denied")]
    text = shared_dir.describe_refusal("/scratch/run1/ckpt", "gpu-a", reports)
    assert "\n" not in text
    assert text.startswith("checkpoint_dir /scratch/run1/ckpt is not shared by every host: "
                           "the marker rank 0 wrote there on gpu-a is not seen on gpu-b (ranks 1, 2), gpu-c (rank 3) "
                           "(no such file; unreadable: PermissionError: Permission denied)")
    assert "checkpoint_dir_shared=False" in text and "HVD_ELASTIC_CHECKPOINT_LOCAL=1" in text
    assert shared_dir.describe_refusal("/d", "gpu-a", [(0, "gpu-a", None), (1, "gpu-b", None)]) is None


def test_verify_in_a_world_of_one_leaves_nothing_behind(tmp_path):
    (tmp_path / f"{shared_dir.MARKER_PREFIX}{'f' * 32}").write_text("left by a killed run")
    assert shared_dir.verify(tmp_path) == 1
    assert listing(tmp_path) == []
    assert shared_dir.verify(tmp_path, enabled=False) == 0


def test_verify_refuses_a_directory_rank_0_cannot_write(tmp_path):
    with pytest.raises(shared_dir.SharedDirError, match=r"rank 0 on .* cannot write there \(FileNotFoundError"):
        shared_dir.verify(tmp_path / "missing")


def make_state() -> TrainingState:
    model = torch.nn.Linear(2, 1)
    return TrainingState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), step=0)


def steps(state: TrainingState, n: int) -> None:
    while state.step < n:
        state.step += 1
        state.commit()


def test_the_runner_checks_before_it_loads_a_checkpoint_and_cleans_up(tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    run(checkpoint_dir=ckpt)(steps)(make_state(), 2)
    order = []
    confirm, load_latest = shared_dir.confirm, CheckpointManager.load_latest
    monkeypatch.setattr(runner.shared_dir, "confirm",
                        lambda directory, header, **k: order.append(("check", header["enabled"]))
                        or confirm(directory, header, **k))
    monkeypatch.setattr(CheckpointManager, "load_latest",
                        lambda self, **k: order.append("load") or load_latest(self, **k))
    resumed = make_state()
    run(checkpoint_dir=ckpt)(steps)(resumed, 3)
    assert order == [("check", True), "load"] and resumed.step == 3
    assert not [n for n in listing(ckpt) if shared_dir.is_marker(n)]

    order.clear()
    run(checkpoint_dir=ckpt, checkpoint_dir_shared=False)(steps)(make_state(), 3)
    monkeypatch.setenv(shared_dir.LOCAL_ENV, "1")
    run(checkpoint_dir=ckpt)(steps)(make_state(), 3)
    assert order == [("check", False), "load", ("check", False), "load"]


def test_a_refusal_stops_the_run_before_anything_is_loaded_or_trained(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise shared_dir.SharedDirError("checkpoint_dir ... is not shared")

    monkeypatch.setattr(runner.shared_dir, "confirm", refuse)
    monkeypatch.setattr(CheckpointManager, "load_latest", lambda self, **k: pytest.fail("loaded before the check"))
    state = make_state()
    with pytest.raises(shared_dir.SharedDirError):
        run(checkpoint_dir=tmp_path / "ckpt")(steps)(state, 3)
    assert state.step == 0


def test_bad_settings_fail_at_once(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="checkpoint_dir_shared must be True or False, got 'no'"):
        RunConfig(checkpoint_dir=tmp_path, checkpoint_dir_shared="no")
    monkeypatch.setenv(shared_dir.LOCAL_ENV, "perhaps")
    # Read with every other switch where the state is made, checkpoints or not: nothing has trained.
    with pytest.raises(ValueError, match="HVD_ELASTIC_CHECKPOINT_LOCAL='perhaps'"):
        make_state()
