"""What durable checkpoints add to the commit path and to training throughput.

One process (checkpoints are written by rank 0 alone; ``hvd.init()`` without a
launcher gives a world of one), a TrainingState over an MLP with Adam, measured
in one run:

* plain commit    -- ``state.commit()`` with no checkpointing: the baseline;
* due commit, copy on commit path -- ``state.commit()`` when the checkpoint listener
                     finds a write due and copies the snapshot into reused staging
                     buffers before handing it to the writer thread;
* due commit, copy in writer -- the same, but the writer thread takes the copy under
                     ``state.snapshot_lock`` (what ``hvd_elastic.run`` does): the commit
                     path only hands over, and the NEXT commit (after a training
                     step) waits for the lock if the copy is not done yet;
* idle commit     -- ``CheckpointManager.commit`` when nothing is due;
* background write -- seconds and MB/s of the writer thread (serialise, sha256, fsync);
* throughput      -- training steps/s with a commit every step: without
                     checkpoints, and with a checkpoint every ``--every`` commits
                     copying on the commit path or in the writer (the writer
                     competes for CPU); runs are interleaved so load drift hits all
                     alike.

    python benchmarks/checkpoint_commit.py [--params 4000000] [--steps 60] [--every 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

import horovod.torch as hvd

from hvd_elastic.training.checkpoint import CheckpointManager
from hvd_elastic.training.state import TrainingState

WIDTH = 1024


def build(params: int) -> TrainingState:
    depth = max(1, params // (WIDTH * WIDTH))
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(depth)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    state = TrainingState(model=model, optimizer=optimizer, step=0)
    train_step(state)  # materialise Adam's state
    state.commit()
    return state


def train_step(state: TrainingState, batch: int = 32) -> None:
    state.optimizer.zero_grad()
    state.model(torch.randn(batch, WIDTH)).square().mean().backward()
    state.optimizer.step()
    state.step += 1


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


class Checkpointing:
    """The listener the run decorator installs, with a switch."""

    def __init__(self, state: TrainingState) -> None:
        self.state, self.manager, self.enabled = state, None, False
        state.add_listener(self)

    def __call__(self, event: str, fields: dict) -> None:
        if self.enabled and event == "commit":
            self.manager.commit(self.state.snapshot, step=self.state.step, commit_count=fields["commit_count"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=4_000_000, help="model parameters (default 4M)")
    parser.add_argument("--steps", type=int, default=60, help="training steps per throughput run")
    parser.add_argument("--every", type=int, default=20, help="checkpoint every N commits in the throughput runs")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved throughput rounds")
    parser.add_argument("--repeat", type=int, default=15, help="samples of each commit timing")
    parser.add_argument("--dir", help="parent of the checkpoint directory (default: the system temp dir)")
    parser.add_argument("--json", help="result file (default benchmarks/results/checkpoint_commit.json)")
    args = parser.parse_args()
    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    state = build(args.params)
    listener = Checkpointing(state)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        def manager(name: str, every: int = 1, locked: bool = True) -> CheckpointManager:
            return CheckpointManager(Path(tmp) / name, every_commits=every, keep_last=2,
                                     lock=state.snapshot_lock if locked else None)

        # Interleaved: plain commit, due commit copying on the commit path, due
        # commit copying in the writer and the commit after the next training step
        # (which may wait for the copy); each followed by a flush so every due
        # commit finds the writer idle.
        on_path, in_writer = manager("on-path", locked=False), manager("in-writer")
        plain_s, on_path_s, handoff_s, next_s, write_s = [], [], [], [], []
        for _ in range(args.repeat):
            listener.enabled = False
            train_step(state)
            plain_s += timed(state.commit, 1)
            listener.enabled, listener.manager = True, on_path
            on_path_s += timed(state.commit, 1)
            t0 = time.perf_counter()
            on_path.flush()
            write_s.append(time.perf_counter() - t0)
            listener.manager = in_writer
            handoff_s += timed(state.commit, 1)
            listener.enabled = False
            train_step(state)
            next_s += timed(state.commit, 1)
            in_writer.flush()
        listener.enabled = False
        nbytes = in_writer.load_latest().manifest["bytes"]
        on_path.close()
        in_writer.close()
        never = manager("idle", every=10**9)
        idle_s = timed(lambda: never.commit(state.snapshot), args.repeat * 20)
        never.close()

        def run(every: int | None, locked: bool = True) -> float:
            listener.manager = manager("loop", every=every or 1, locked=locked)
            listener.enabled = every is not None
            t0 = time.perf_counter()
            for _ in range(args.steps):
                train_step(state)
                state.commit()
            elapsed = time.perf_counter() - t0
            listener.manager.close()
            return args.steps / elapsed

        run(None)  # warm-up
        runs = [(run(None), run(args.every, locked=False), run(args.every)) for _ in range(args.rounds)]
        plain, with_on_path, with_in_writer = (statistics.median(r[i] for r in runs) for i in range(3))

    plain_ms = statistics.median(plain_s) * 1e3
    on_path_ms = statistics.median(on_path_s) * 1e3
    handoff_ms = statistics.median(handoff_s) * 1e3
    next_ms = statistics.median(next_s) * 1e3
    write = statistics.median(write_s)
    result = {
        "params": args.params, "checkpoint_bytes": nbytes,
        "plain_commit_ms": plain_ms,
        "due_commit_copy_on_path_ms": on_path_ms, "on_path_over_plain": on_path_ms / plain_ms,
        "due_commit_copy_in_writer_ms": handoff_ms, "in_writer_over_plain": handoff_ms / plain_ms,
        "next_commit_after_in_writer_ms": next_ms, "next_over_plain": next_ms / plain_ms,
        "idle_commit_us": statistics.median(idle_s) * 1e6,
        "background_write_s": write, "write_mb_per_s": nbytes / write / 1e6,
        "steps_per_s_plain": plain, "steps_per_s_copy_on_path": with_on_path,
        "steps_per_s_copy_in_writer": with_in_writer, "throughput_ratio_on_path": with_on_path / plain,
        "throughput_ratio_in_writer": with_in_writer / plain, "checkpoint_every": args.every,
    }
    rows = [
        ("checkpoint size", f"{nbytes / 1e6:.1f} MB"),
        ("plain commit (baseline)", f"{plain_ms:.2f} ms"),
        ("due commit, copy on commit path", f"{on_path_ms:.2f} ms  ({result['on_path_over_plain']:.2f}x baseline)"),
        ("due commit, copy in writer (run)", f"{handoff_ms:.2f} ms  ({result['in_writer_over_plain']:.2f}x baseline)"),
        ("  next commit, after a step", f"{next_ms:.2f} ms  ({result['next_over_plain']:.2f}x baseline)"),
        ("commit with nothing due (listener)", f"{result['idle_commit_us']:.1f} us"),
        ("background write", f"{write:.3f} s  ({result['write_mb_per_s']:.0f} MB/s)"),
        ("steps/s, commit every step", f"{plain:.2f}"),
        (f"  + checkpoint every {args.every}, copy on path", f"{with_on_path:.2f}  ({with_on_path / plain:.3f}x)"),
        (f"  + checkpoint every {args.every}, copy in writer", f"{with_in_writer:.2f}  ({with_in_writer / plain:.3f}x)"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    out = Path(args.json) if args.json else Path(__file__).parent / "results" / "checkpoint_commit.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
