"""Checkpoints fail loudly where they used to fail silently (issue 11), in one process.

Each test here failed against the code before the fix; the docstring says how.
"""

from __future__ import annotations

import ast
import dataclasses
import tracemalloc
from pathlib import Path

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


def test_a_value_weights_only_cannot_read_is_a_write_error_naming_it(tmp_path):
    """Before: the checkpoint was written, and at resume every one was refused by
    ``weights_only=True`` and skipped: the job silently started again from step 0."""
    state = make_state(settings=Settings())
    run(checkpoint_dir=tmp_path / "ckpt", checkpoint_every_commits=1, event_log=tmp_path / "events.jsonl")(
        train_until)(state, 2)
    errors = [e["error"] for e in EventLog.read(tmp_path / "events.jsonl", event="checkpoint_error")]
    assert errors, "an unloadable checkpoint was written"
    assert "['values']['settings']" in errors[0] and "Settings" in errors[0] and "add_safe_globals" in errors[0]
    assert not list((tmp_path / "ckpt").glob("ckpt-*")), "a checkpoint that cannot be loaded was left on disk"


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
