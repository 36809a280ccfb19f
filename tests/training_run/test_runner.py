"""The run decorator in one process (a world of one, static path): resume, final
checkpoint, write errors in the event log, bad settings."""

from __future__ import annotations

import errno
import json

import pytest
import torch

import horovod.torch as hvd

import hvd_elastic
from hvd_elastic.training.checkpoint import CheckpointManager
from hvd_elastic.training.events import EventLog
from hvd_elastic.training.runner import RunConfig, run
from hvd_elastic.training.state import TrainingState


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvd.init()
    yield


def make_state(**values) -> TrainingState:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return TrainingState(model=model, optimizer=optimizer, step=0, **values)


def train_until(state: TrainingState, until: int) -> int:
    start = state.step
    x = torch.arange(12.0).reshape(4, 3) / 10
    while state.step < until:
        state.optimizer.zero_grad()
        state.model(x).square().mean().backward()
        state.optimizer.step()
        state.step += 1
        state.commit()
    return start


def test_resumes_where_the_last_call_left_off(tmp_path):
    settings = dict(checkpoint_dir=tmp_path / "ckpt", checkpoint_every_commits=3, event_log=tmp_path / "events.jsonl")
    train = hvd_elastic.run(**settings)(train_until)  # the lazy package export

    assert train(make_state(), 5) == 0
    # A checkpoint at the 3rd commit and one at exit for step 5.
    manifests = CheckpointManager(settings["checkpoint_dir"]).checkpoints()
    assert [json.loads(m.read_text())["step"] for m in manifests] == [5, 3]

    assert train(make_state(), 5) == 5  # resumed, nothing left to do: no new checkpoint
    assert len(CheckpointManager(settings["checkpoint_dir"]).checkpoints()) == 2

    resumed = make_state()
    assert train(resumed, 8) == 5
    uninterrupted = make_state()
    run(checkpoint_dir=tmp_path / "other")(train_until)(uninterrupted, 8)
    for a, b in zip(resumed.model.parameters(), uninterrupted.model.parameters()):
        assert torch.equal(a, b)

    events = EventLog.read(settings["event_log"])
    assert [e["step"] for e in events if e["event"] == "resume"] == [5, 5]
    assert [e["event"] for e in events].count("finish") == 3
    assert {e["rank"] for e in events} == {0} and {e["size"] for e in events} == {1}


def test_write_errors_reach_the_event_log_and_training_goes_on(tmp_path, monkeypatch):
    # A full disk: every write fails (a value no checkpoint could hold is refused earlier, by the state).
    def no_space(self, path, snapshot):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(CheckpointManager, "_write_payload", no_space)
    state = make_state()
    train = run(checkpoint_dir=tmp_path / "ckpt", checkpoint_every_commits=2,
                event_log=tmp_path / "events.jsonl")(train_until)
    assert train(state, 4) == 0
    assert state.step == 4
    names = [e["event"] for e in EventLog.read(tmp_path / "events.jsonl")]
    # Commit 2's write fails, and commit 4's unless commit 2's failed write was still in flight then (at most one
    # write is in flight; a busy box's writer thread may not have run yet); the exit write retries and fails too.
    assert names.count("checkpoint_error") in (2, 3) and "checkpoint" not in names and names[-1] == "finish"
    errors = [e["error"] for e in EventLog.read(tmp_path / "events.jsonl", event="checkpoint_error")]
    assert all("No space left on device" in error for error in errors)
    assert CheckpointManager(tmp_path / "ckpt").load_latest() is None


def test_listeners_of_a_finished_call_go_quiet(tmp_path):
    state = make_state()
    run(event_log=tmp_path / "events.jsonl")(train_until)(state, 2)
    train_until(state, 4)  # commits outside the decorated call
    commits = [e["commit_count"] for e in EventLog.read(tmp_path / "events.jsonl", event="commit")]
    assert commits == [1, 2]


def test_bad_settings_and_states_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="need a checkpoint_dir"):
        RunConfig(checkpoint_every_commits=5)
    with pytest.raises(TypeError, match="either config= or individual settings"):
        run(config=RunConfig(), keep_last=2)
    with pytest.raises(ValueError, match="keep_last must be a positive integer, got 0"):
        run(checkpoint_dir=tmp_path, keep_last=0)
    with pytest.raises(ValueError, match="every_seconds"):
        RunConfig(checkpoint_dir=tmp_path, checkpoint_every_seconds="10")
    horovod_state = hvd.elastic.TorchState(model=torch.nn.Linear(1, 1), step=0)
    with pytest.raises(TypeError, match="TorchState lacks snapshot, load_snapshot, add_listener"):
        run(checkpoint_dir=tmp_path)(train_until)(horovod_state, 1)



def test_progress_log_has_a_row_per_commit_with_the_states_numbers(tmp_path):
    progress = tmp_path / "progress.jsonl"
    state = make_state(epoch=3, loss=0.0, note="not a number", best=None)

    @run(progress_log=progress)
    def train(state):
        for _ in range(3):
            state.loss = state.step / 10
            state.step += 1
            state.commit()

    train(state)
    rows = [json.loads(line) for line in progress.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and [r["loss"] for r in rows] == [0.0, 0.1, 0.2]
    assert all(r["size"] == 1 and r["epoch"] == 3 and r["time"] > 0 and set(r) == {
        "time", "size", "commit_count", "step", "epoch", "loss"} for r in rows)
    assert [r["commit_count"] for r in rows] == [1, 2, 3]
