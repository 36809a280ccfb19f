"""The verdict's rank-independent checks on hand-made finals (no processes).

Every rank agrees and every sample is once in each of these runs: only the
committed step chain, the scheduler and the optimizer step counts can tell.
"""

from __future__ import annotations

import json
from pathlib import Path

from hvd_elastic.report.ledger import chain_problems, step_problems, verdict

SAMPLES = 4
HISTORY = [[0, 0, 2, 2], [0, 2, 2, 2]]  # one epoch, two steps of 2 samples at world size 2


def write_run(out: Path, digests: list, final_checksum: str, steps: int = 2) -> None:
    (out / "ledger").mkdir()
    rows = [{"key": key, "rank": r, "idx": [key[1] + r]} for key in HISTORY for r in (0, 1)]
    (out / "ledger" / "a.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    for rank in (0, 1):
        (out / f"final-{rank}.json").write_text(json.dumps({
            "rank": rank, "size": 2, "checksum": final_checksum, "scheduler": {"last_epoch": steps},
            "optimizer_steps": [steps, steps], "history": HISTORY if rank == 0 else None,
            "digests": digests if rank == 0 else None, "epochs": 1, "samples": SAMPLES}))


def test_an_intact_chain_passes(tmp_path):
    write_run(tmp_path, [["a", "b"], ["b", "c"]], "c")
    assert verdict(tmp_path).problems() == []


def test_a_resume_from_a_fresh_model_breaks_the_chain(tmp_path):
    """Step 2 started from "x", not from "b" that step 1 committed: a fresh initialisation the sync made equal."""
    write_run(tmp_path, [["a", "b"], ["x", "c"]], "c")
    result = verdict(tmp_path)
    assert result.params_identical and result.lost == result.duplicated == 0
    assert any("started from a state that is not what step [0, 0, 2, 2] ended with" in p for p in result.problems())


def test_a_final_state_that_no_committed_step_produced_is_caught(tmp_path):
    write_run(tmp_path, [["a", "b"], ["b", "c"]], "d")
    assert sum("final state is not what the last committed step" in p for p in verdict(tmp_path).problems()) == 2


def test_counts_that_moved_past_the_committed_steps_are_caught():
    final = {"rank": 1, "checksum": "c", "scheduler": {"last_epoch": 3}, "optimizer_steps": [3, 2]}
    found = step_problems(final, HISTORY, [["a", "b"], ["b", "c"]])
    assert found == ["rank 1: scheduler last_epoch 3 after 2 committed steps",
                     "rank 1: optimizer state step [3] after 2 committed steps"]


def test_a_run_without_its_digests_is_not_passed_silently(tmp_path):
    assert chain_problems(HISTORY, None) == ["no committed digests chain in rank 0's final"]
    assert chain_problems(HISTORY, [["a", "b"]]) == ["1 committed digests for 2 committed steps"]
    write_run(tmp_path, None, "c")
    assert verdict(tmp_path).problems() == ["no committed digests chain in rank 0's final"]  # once, not per rank
