"""The one-collective object broadcast and allgather, between three real Gloo ranks under horovodrun."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from testbed import VENV_BIN, child_env

WORKER = Path(__file__).with_name("objects_worker.py")


@pytest.mark.slow
def test_every_rank_receives_the_roots_object_and_everyones_objects_in_rank_order(tmp_path):
    cmd = [str(VENV_BIN / "horovodrun"), "-np", "3", "-H", "localhost:3", "--gloo", str(VENV_BIN / "python"),
           str(WORKER), str(tmp_path)]
    done = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=120, start_new_session=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]

    assert all(r == ranks[0] for r in ranks), ranks  # the root's own answer included
    seen = ranks[0]
    assert seen["from 0"] == repr({"rank": 0, "nan": float("nan"), "text": "h\u00f6st"})
    assert seen["from 2"] == repr(("two", 2))
    assert seen["none"] == "None"
    assert seen["lambda"] == repr("made on rank 0")  # cloudpickle, as Horovod's: user values may hold one
    assert seen["big"] == "True"
    assert seen["gather"] == repr(["", "xxx", "xxxxxx"])
    assert seen["gather none"] == repr([0, None, 2])
    assert seen["repeated"] == repr([[], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4], list(range(500)), [0]])
    assert seen["repeated gather"] == repr([[0, 1, 2], [0, 1, 2], [0, 10**9, 2 * 10**9]])
