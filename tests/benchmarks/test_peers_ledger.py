"""benchmarks/peers_ledger.py: the chain walk keeps exactly the steps the final model descends from."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from peers_ledger import Writer, judge, kept_chains, link, read_rows  # noqa: E402


def steps(writer: Writer, chain: int, token: int, first: int, batches: list[list[int]], ranks: int = 2):
    """Rows for consecutive steps from ``chain`` (each batch split over ``ranks``); the last chain value."""
    for n, batch in enumerate(batches, start=first):
        parent, chain = chain, link(chain, token, n)
        for rank in range(ranks):
            writer.step(float(n), n, chain, parent, 0, ranks, rank, batch[rank::ranks], 0.5)
    return chain


def test_a_rollback_throws_its_steps_away_and_the_retrained_samples_count_once(tmp_path):
    writer = Writer(str(tmp_path), "h", "test")
    committed = steps(writer, 0, 1, 1, [[0, 1], [2, 3]])
    steps(writer, committed, 1, 3, [[4, 5]])  # trained, then the world failed before the commit: rolled back
    final = steps(writer, committed, 2, 3, [[4, 5], [6, 7]])  # the new world retrains from step 2
    rows = read_rows(str(tmp_path))
    kept, root = kept_chains(rows, final)
    assert len(kept) == 4 and root == 0
    verdict = judge(rows, final, samples=8, complete_epochs=1)
    assert (verdict.steps_kept, verdict.steps_thrown, verdict.lost, verdict.duplicated) == (4, 1, 0, 0)
    assert verdict.unique_samples == 8  # the thrown step's samples are not useful
    assert verdict.broken == ""


def test_lost_and_duplicated_samples_and_a_broken_chain_are_counted(tmp_path):
    writer = Writer(str(tmp_path), "h", "test")
    final = steps(writer, 0, 1, 1, [[0, 1], [0, 3]])  # sample 0 twice, 2 never
    verdict = judge(read_rows(str(tmp_path)), final, samples=4, complete_epochs=1)
    assert (verdict.lost, verdict.duplicated) == (1, 1)
    assert verdict.unique_samples == 3  # goodput counts the twice-trained sample once
    orphan = steps(writer, 12345, 1, 9, [[1, 2]])  # a parent no row has: rows went missing
    assert "breaks at 12345" in judge(read_rows(str(tmp_path)), orphan, samples=4, complete_epochs=1).broken
