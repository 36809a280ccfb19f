"""TrainingState.sync between four real Horovod (Gloo) processes where only some ranks need the state.

The worker (transfer_worker.py) runs the scenarios; here every rank must end
bitwise equal to rank 0 (-0.0, a NaN payload, int64 and bool buffers
included), a restore() after the sync must come back to it, and only the
ranks that lacked something may have received bytes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from testbed import VENV_BIN, Job, child_env

HERE = Path(__file__).parent
RANKS = range(4)
# BatchNorm1d(256)'s running_mean and running_var: what drifts between ranks fed different batches.
BN_STATS = 2 * 256 * 4

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("transfer")
    cmd = [VENV_BIN / "horovodrun", "--gloo", "-np", "4", "-H", "localhost:4", sys.executable,
           HERE / "transfer_worker.py"]
    with Job(cmd, env=child_env(OUT=str(out)), logdir=out, name="horovodrun") as job:
        job.start().finish(timeout=300)

    def load(scenario):
        return [json.loads((out / f"{scenario}-{r}.json").read_text()) for r in RANKS]
    return load


def assert_identical(ranks):
    reference = ranks[0]["tensors"]
    assert "model/special" in reference and "optimizer/0.exp_avg" in reference
    for r, got in enumerate(ranks):
        differs = sorted(k for k in reference if got["tensors"].get(k) != reference[k])
        assert not differs and set(got["tensors"]) == set(reference), f"rank {r} differs from rank 0 in {differs}"
        assert got["restored"] == got["tensors"], f"rank {r}: restore() after the sync came back elsewhere"


def test_a_joiner_gets_stripes_from_every_survivor_and_the_survivors_get_nothing(results):
    ranks = results("joiner")
    assert_identical(ranks)
    syncs = [r["sync"] for r in ranks]
    assert [s["transfer"] for s in syncs] == ["stripes"] * 4 and syncs[0]["receivers"] == 1
    assert {s["plan"] for s in syncs} == {"digests"}
    assert syncs[1]["received_bytes"] == syncs[2]["received_bytes"] == 0
    # the three donors each sent about a third of what the joiner received
    total = syncs[3]["received_bytes"]
    assert total > 0 and sum(s["sent_bytes"] for s in syncs[:3]) == total
    assert all(total / 3 - 4096 <= s["sent_bytes"] <= total / 3 + 4096 for s in syncs[:3])
    assert ranks[3]["moments"] == ["exp_avg", "exp_avg_sq", "step"]  # created from the bytes, no dummy step


def test_two_joiners_get_everything_and_a_survivor_only_its_drifted_statistics(results):
    ranks = results("two_joiners")
    assert_identical(ranks)
    syncs = [r["sync"] for r in ranks]
    # round one striped everything to the joiners (rank 1's stripe carried its drifted statistics),
    # round two relayed the statistics to all three from rank 0
    assert syncs[0]["transfer"] == "relay+stripes" and syncs[0]["receivers"] == 3
    assert syncs[1]["received_bytes"] == BN_STATS
    assert syncs[2]["received_bytes"] == syncs[3]["received_bytes"] > 100 * BN_STATS


def test_a_survivor_one_commit_behind_is_detected_and_synced(results):
    ranks = results("behind")
    assert_identical(ranks)
    syncs = [r["sync"] for r in ranks]
    assert syncs[0]["receivers"] == 3 and syncs[1]["received_bytes"] == BN_STATS
    # its lineage is not rank 0's: it is sent everything, without hashing, like the joiner
    assert syncs[2]["received_bytes"] == syncs[3]["received_bytes"] > 100 * BN_STATS


def test_a_diverged_survivor_s_wrong_stripes_to_a_joiner_are_found_and_resent(results):
    ranks = results("diverged")
    assert_identical(ranks)
    syncs = [r["sync"] for r in ranks]
    assert {s["plan"] for s in syncs} == {"digests"}
    # rank 1 is sent exactly its parameters (its moments were never touched), rank 2 nothing
    assert syncs[1]["received_bytes"] == ranks[1]["parameter_bytes"] and syncs[2]["received_bytes"] == 0
    # rank 3 got everything in round one, then again whatever rank 1's stripes had spoilt
    assert syncs[3]["received_bytes"] > ranks[3]["state_bytes"]


def test_newcomers_around_one_survivor_get_everything_without_digests(results):
    ranks = results("newcomers")
    assert_identical(ranks)
    syncs = [r["sync"] for r in ranks]
    # no rank shares rank 0's lineage: the plan comes from the lineages alone, nobody hashes
    # rank 0 is the one donor of a world of 4: it sends each one a stripe, which they relay to each other
    assert all(s["plan"] == "lineages" and s["transfer"] == "relay" for s in syncs)
    assert syncs[0]["receivers"] == 3
    assert all(s["received_bytes"] == syncs[0]["sent_bytes"] > 0 for s in syncs[1:])


def test_after_a_failure_everyone_restored_from_nothing_moves(results):
    ranks = results("restored")
    assert_identical(ranks)
    assert all(r["sync"]["transfer"] == "none" and r["sync"]["bytes"] == 0 for r in ranks)
    assert all(r["sync"]["plan"] == "digests" for r in ranks)


def test_rank_0_live_state_newer_than_its_commit_reaches_everyone_and_only_what_moved(results):
    ranks = results("fresh")
    assert_identical(ranks)
    syncs = [r["sync"] for r in ranks]
    # rank 0 copied its live tensors first; the digests found the one bias it had changed
    assert all(s["plan"] == "digests" and s["transfer"] == "relay" for s in syncs)
    assert all(s["received_bytes"] == 4 * 4 for s in syncs[1:])  # Linear(256, 4).bias, float32
