"""Checkpoints fail loudly where they used to fail silently (issues 11 and 43), in one process.

Each test here failed against the code before the fix; the docstring says how.
"""

from __future__ import annotations

import ast
import dataclasses
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

import horovod.torch as hvd

import hvd_elastic
from hvd_elastic.training.checkpoint import CheckpointManager, UnreadableCheckpoints
from hvd_elastic.training.events import EventLog
from hvd_elastic.training.runner import RunConfig, run
from hvd_elastic.training.state import TrainingState


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvd.init()
    yield


@dataclasses.dataclass
class Settings:
    """Picklable, so torch.save writes it, but torch.load(weights_only=True) refuses it."""

    lr: float = 0.1


def make_state(**values) -> TrainingState:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return TrainingState(model=model, optimizer=optimizer, rng=False, step=0, **values)


def train_until(state: TrainingState, until: int) -> None:
    while state.step < until:
        state.step += 1
        state.commit()


@pytest.mark.parametrize("bad, shown", [
    (Settings(), r"\S*Settings"), (lambda: 1, "builtins.function"), (object(), "builtins.object"),
    (np.zeros(3), "numpy.ndarray"), (np.float64(0.5), "numpy.float64"),
])
def test_a_value_no_checkpoint_could_hold_is_refused_where_it_is_set(tmp_path, bad, shown):
    """Before (issue 43): the state took it, every checkpoint write then failed with one
    ERROR line while training went on, and the directory stayed empty: a whole-job loss
    started over from step 0.  Now the line that stores it raises, on every rank alike."""
    with pytest.raises(TypeError, match=rf"^state\.extra = .*\(type {shown}\) cannot be checkpointed"):
        make_state(extra=bad)
    state = make_state(extra=0.0)
    with pytest.raises(TypeError, match=rf"^state\.extra = .*\(type {shown}\) cannot be checkpointed") as raised:
        state.extra = bad
    assert "\n" not in str(raised.value)
    assert state.extra == 0.0, "the refused value was stored anyway"


def test_numpy_values_are_told_how_to_convert():
    with pytest.raises(TypeError, match=r"convert it \(x\.item\(\)\)"):
        make_state(loss=np.float32(1.0))
    with pytest.raises(TypeError, match=r"convert it \(torch\.from_numpy\(x\)\)"):
        make_state(weights=np.ones(2))


def test_a_value_changed_in_place_is_refused_at_the_commit_before_any_checkpoint(tmp_path):
    """``state.history.append(x)`` passes no assignment: the commit that would hold it
    raises (before its host check, so no rank is left waiting in a collective), and
    the checkpoints written before stay loadable."""
    ckpt = tmp_path / "ckpt"

    def train(state):
        train_until(state, 2)
        state.history.append(Settings())
        state.step += 1
        state.commit()

    state = make_state(history=[])
    with pytest.raises(TypeError, match=r"^state\.history\[0\] = Settings\(lr=0\.1\) \(type .*Settings\)"):
        run(checkpoint_dir=ckpt, checkpoint_every_commits=1, event_log=tmp_path / "events.jsonl")(train)(state)
    assert not list(EventLog.read(tmp_path / "events.jsonl", event="checkpoint_error"))
    resumed = CheckpointManager(ckpt).load_latest()
    assert resumed.manifest["step"] in (1, 2)  # a write that falls due while one is in flight waits
    assert resumed.snapshot["values"]["history"] == []


def test_a_component_whose_state_dict_no_checkpoint_could_hold_is_refused_at_construction():
    class Ema:
        def state_dict(self):
            return {"decay": np.float64(0.99)}

        def load_state_dict(self, state):
            pass

    with pytest.raises(TypeError, match=r"^ema\.state_dict\(\)\['decay'\] = np\.float64\(0\.99\) \(type numpy"):
        make_state(ema=Ema())


def test_values_weights_only_reads_round_trip_through_a_checkpoint(tmp_path):
    """Sets, nested containers, dtypes and tensors are all values a checkpoint keeps."""
    values = {"seen": {1, 2}, "nested": {"a": [1, (2.0, "x")], "b": None}, "dtype": torch.float16,
              "mean": torch.arange(3.0)}
    run(checkpoint_dir=tmp_path / "ckpt", checkpoint_every_commits=1)(train_until)(make_state(**values), 2)
    state = make_state(**{k: None for k in values})
    run(checkpoint_dir=tmp_path / "ckpt")(lambda s: None)(state)
    assert state.step == 2
    for name, value in values.items():
        got = getattr(state, name)
        assert torch.equal(got, value) if isinstance(value, torch.Tensor) else got == value, name


def test_the_writer_still_refuses_an_unloadable_snapshot_naming_it(tmp_path):
    """The manager's own check stays for snapshots that do not come from a TrainingState."""
    events = []
    mgr = CheckpointManager(tmp_path, on_event=lambda name, fields: events.append((name, fields)))
    assert not mgr.save({"values": {"settings": Settings()}}, step=1)
    mgr.close()
    assert [name for name, _ in events] == ["checkpoint_error"]
    error = events[0][1]["error"]
    assert "['values']['settings']" in error and "Settings" in error and "add_safe_globals" in error
    assert not list(tmp_path.glob("ckpt-*")), "a checkpoint that cannot be loaded was left on disk"


def _two_checkpoints_then_truncated(directory: Path) -> list[Path]:
    mgr = CheckpointManager(directory)
    for step in (1, 2):
        mgr.save({"values": {"step": step}, "w": torch.ones(100) * step}, step=step)
    mgr.close()
    payloads = sorted(directory.glob("ckpt-*.pt"))
    for payload in payloads:
        payload.write_bytes(payload.read_bytes()[:50])
    return payloads


def test_a_directory_of_checkpoints_none_of_which_loads_is_an_error(tmp_path):
    """Before: ``load_latest`` skipped every one with a warning and returned None (fresh start)."""
    payloads = _two_checkpoints_then_truncated(tmp_path)
    with pytest.raises(UnreadableCheckpoints) as raised:
        CheckpointManager(tmp_path).load_latest()
    message = str(raised.value)
    assert "\n" not in message
    for payload in payloads:
        assert payload.name in message
    assert "checksum mismatch" in message and "fresh_start_if_unreadable=True" in message
    assert CheckpointManager(tmp_path).load_latest(fresh_start_if_unreadable=True) is None


def test_the_run_decorator_stops_unless_a_fresh_start_is_asked_for(tmp_path):
    _two_checkpoints_then_truncated(tmp_path / "ckpt")
    with pytest.raises(UnreadableCheckpoints):
        run(checkpoint_dir=tmp_path / "ckpt")(train_until)(make_state(), 1)
    state = make_state()
    run(checkpoint_dir=tmp_path / "ckpt", fresh_start_if_unreadable=True)(train_until)(state, 1)
    assert state.step == 1


def test_load_latest_does_not_hold_the_payload_in_memory(tmp_path):
    """Before: the whole payload was read into a bytes object and then loaded from a
    copy of it: twice the checkpoint's size in RAM on resume."""
    mgr = CheckpointManager(tmp_path)
    mgr.save({"w": torch.ones(8 << 20)}, step=1)  # 32 MiB
    mgr.close()
    tracemalloc.start()
    try:
        ckpt = CheckpointManager(tmp_path).load_latest()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert torch.equal(ckpt.snapshot["w"], torch.ones(8 << 20))
    assert peak < 4 << 20, f"load_latest allocated {peak >> 20} MiB of Python objects for a 32 MiB payload"


def test_run_config_and_every_lazy_export_are_visible_to_type_checkers():
    """Before: ``RunConfig`` was not exported, and the lazy exports were invisible to
    type checkers and IDEs (only a module ``__getattr__``)."""
    assert hvd_elastic.RunConfig is RunConfig
    tree = ast.parse(Path(hvd_elastic.__file__).read_text())
    typed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            typed |= {alias.asname or alias.name for n in node.body if isinstance(n, ast.ImportFrom)
                      for alias in n.names}
    assert typed == set(hvd_elastic._LAZY)
    for name, module in hvd_elastic._LAZY.items():
        assert getattr(hvd_elastic, name).__module__ == module
