"""benchmarks/peers_rejudge.py: a run's records re-judged from its workdir and log, the harness's way."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import peers_rejudge  # noqa: E402
from peers_ledger import Writer, link  # noqa: E402


def ledger(out: Path, first_t: float, steps: int, final: bool) -> int:
    """``steps`` steps of one rank over samples 0..7 (two per step, epoch = step // 4); the last chain."""
    writer, chain = Writer(str(out), "h", "test"), 0
    for n in range(1, steps + 1):
        parent, chain = chain, link(chain, 1, n)
        writer.step(first_t + n, n, chain, parent, (n - 1) // 4, 1, 0, [2 * ((n - 1) % 4), 2 * ((n - 1) % 4) + 1], 0.5)
    if final:
        (out / "final.json").write_text(json.dumps({"chain": chain}))
    return chain


def test_a_finished_and_a_cut_off_run_are_judged_from_their_ledgers(tmp_path):
    reference = {"useful_samples_per_s": 1.0, "test_accuracy": None}
    lines = ["peers: stacks done, cut; 2 hosts; seed 5; 1 faults; 2 epochs of 8 samples"]
    for stack, steps, final in (("done", 8, True), ("cut", 6, False)):
        out = tmp_path / "work" / stack / "faults" / "out"
        out.mkdir(parents=True)
        ledger(out, 100.0, steps, final)
        record = {"stack": stack, "wall_s": 20.0, "exit_code": 0 if final else None, "deaths": [], "seed": 5,
                  "steps_kept": 0}
        lines += [f"  {stack} reference: {json.dumps(reference)}",
                  f"  {stack}: {{'time': 103.5, 'kind': 'worker-kill', 'host': 'h'}}",
                  f"  {stack} faults: {json.dumps(record)}"]
    (tmp_path / "log").write_text("\n".join(lines) + "\n")
    (tmp_path / "peers.json").write_text(json.dumps({"seed": 5, "records": []}))
    argv = [str(tmp_path / "log"), str(tmp_path / "work"), "--json", str(tmp_path / "peers.json")]
    assert peers_rejudge.main(argv) == 0
    records = {r["stack"]: r for r in json.loads((tmp_path / "peers.json").read_text())["records"]}
    assert (records["done"]["finished"], records["done"]["steps_kept"], records["done"]["samples_lost"]) == (True, 8, 0)
    assert (records["cut"]["finished"], records["cut"]["epochs_done"], records["cut"]["steps_kept"]) == (False, 1, 6)
    assert records["cut"]["goodput"] == round(12 / 20.0, 3)  # 12 unique samples in 20 s, against 1 per s
    assert (tmp_path / "peers.png").exists()


def test_runs_of_some_stacks_each_are_judged_and_drawn_as_one(tmp_path):
    reference = {"useful_samples_per_s": 1.0, "test_accuracy": None}
    logs = []
    for stack in ("first", "second"):
        out = tmp_path / "work" / stack / "faults" / "out"
        out.mkdir(parents=True)
        ledger(out, 100.0, 8, True)
        record = {"stack": stack, "wall_s": 20.0, "exit_code": 0, "deaths": [], "seed": 5, "steps_kept": 0}
        logs.append(tmp_path / f"{stack}.log")
        logs[-1].write_text("\n".join([f"peers: stacks {stack}; 2 hosts; seed 5; 1 faults; 2 epochs of 8 samples",
                                        f"  {stack} reference: {json.dumps(reference)}",
                                        f"  {stack} faults: {json.dumps(record)}"]) + "\n")
    (tmp_path / "peers.json").write_text(json.dumps({"seed": 5, "records": []}))
    argv = [*map(str, logs), str(tmp_path / "work"), "--json", str(tmp_path / "peers.json")]
    assert peers_rejudge.main(argv) == 0
    records = json.loads((tmp_path / "peers.json").read_text())["records"]
    assert [(r["stack"], r["steps_kept"]) for r in records] == [("first", 8), ("second", 8)]
