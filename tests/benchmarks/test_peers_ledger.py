"""benchmarks/peers_ledger.py: the chain walk keeps exactly the steps the final model descends from."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from peers_ledger import Writer, judge, kept_chains, kept_steps, link, read_rows, recoveries, tip  # noqa: E402


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


def test_a_run_cut_off_unfinished_is_judged_from_its_newest_step(tmp_path):
    writer = Writer(str(tmp_path), "h", "test")
    committed = steps(writer, 0, 1, 1, [[0, 1], [2, 3]])
    steps(writer, committed, 1, 3, [[4, 5]])  # rolled back
    newest = steps(writer, committed, 2, 3, [[4, 5], [6, 7]])  # the job was cut off here, with no final chain
    rows = read_rows(str(tmp_path))
    assert tip(rows) == (newest, 0) and tip([]) == (-1, 0)
    chain, epochs = tip(rows)
    verdict = judge(rows, chain, samples=8, complete_epochs=epochs)
    assert (verdict.steps_kept, verdict.steps_thrown, verdict.unique_samples, verdict.broken) == (4, 1, 8, "")
    assert verdict.epochs == {}  # epoch 0 is not complete: nothing is called lost


def test_lost_and_duplicated_samples_and_a_broken_chain_are_counted(tmp_path):
    writer = Writer(str(tmp_path), "h", "test")
    final = steps(writer, 0, 1, 1, [[0, 1], [0, 3]])  # sample 0 twice, 2 never
    verdict = judge(read_rows(str(tmp_path)), final, samples=4, complete_epochs=1)
    assert (verdict.lost, verdict.duplicated) == (1, 1)
    assert verdict.unique_samples == 3  # goodput counts the twice-trained sample once
    orphan = steps(writer, 12345, 1, 9, [[1, 2]])  # a parent no row has: rows went missing
    assert "breaks at 12345" in judge(read_rows(str(tmp_path)), orphan, samples=4, complete_epochs=1).broken


def test_a_fault_costs_its_longest_stall_and_the_time_to_the_first_step_at_another_size():
    # 4 ranks step every 0.1 s; a leave at t=10 stalls them until 12.5, then 3 ranks train;
    # a partition at t=20 is healed in place (a 1 s stall, the size never changes).
    steps = [(t / 10, 4) for t in range(0, 101)] + [(12.5 + t / 10, 3) for t in range(0, 70)]
    steps += [(21 + t / 10, 3) for t in range(0, 50)]
    faults = [{"time": 10.0, "kind": "leave", "host": "h3"}, {"time": 15.0, "kind": "join", "skipped": "no host"},
              {"time": 20.0, "kind": "partition", "host": "h1"}]
    got = recoveries(faults, sorted(steps), end=26.0)
    assert got["leave"] == {"pause": [2.5], "resize": [2.5]}
    assert got["partition"] == {"pause": [1.0], "resize": [None]}  # the fault at 20, the next step at 21
    assert "join" not in got  # skipped: not a fault the stack paid for


def test_kept_steps_are_timed_by_their_first_rank_and_skip_thrown_chains(tmp_path):
    writer = Writer(str(tmp_path), "h", "test")
    writer.step(1.0, 1, 11, 0, 0, 2, 0, [0], 0.5)
    writer.step(1.2, 1, 11, 0, 0, 2, 1, [1], 0.5)
    writer.step(2.0, 2, 12, 11, 0, 2, 0, [2], 0.5)  # thrown away
    assert kept_steps(read_rows(str(tmp_path)), {11}) == [(1.0, 2)]

