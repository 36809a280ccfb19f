"""What durable checkpoints add to the commit path and to training throughput.

Measured in one run, on one process (checkpoints are written by rank 0 alone):

* commit copy     -- the baseline: ``copy_`` of the committed bytes (model + Adam state)
                     into preallocated buffers, which is what a commit costs;
* due commit      -- ``CheckpointManager.commit`` when a checkpoint is due: the staging
                     copy into reused buffers plus handing it to the writer thread;
* idle commit     -- ``CheckpointManager.commit`` when no checkpoint is due;
* background write -- seconds and MB/s of the writer thread (serialise, sha256, fsync);
* throughput      -- training steps/s with a commit every step, with and without a
                     checkpoint every ``--every`` commits (the writer competes for CPU).

    python benchmarks/checkpoint_commit.py [--params 4000000] [--steps 60] [--rounds 5] [--every 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from hvd_elastic.training.checkpoint import CheckpointManager


def build(params: int, width: int = 1024) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    depth = max(1, params // (width * width))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    step(model, optimizer, width)  # materialise Adam's state
    return model, optimizer


def step(model, optimizer, width: int, batch: int = 32) -> None:
    optimizer.zero_grad()
    model(torch.randn(batch, width)).square().mean().backward()
    optimizer.step()


def live_tensors(model, optimizer) -> dict:
    snap = {"model": model.state_dict(), "optimizer": {}}
    for i, st in enumerate(optimizer.state.values()):
        snap["optimizer"][i] = {k: v for k, v in st.items() if isinstance(v, torch.Tensor)}
    return snap


def flat(tree) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    return [t for v in tree.values() for t in flat(v)]


class Committer:
    """The baseline commit: copy_ into buffers allocated once."""

    def __init__(self, live: dict) -> None:
        self.live = flat(live)
        self.committed = [t.detach().clone() for t in self.live]
        self._tree = _rebuild(live, iter(self.committed))

    def commit(self) -> dict:
        for dst, src in zip(self.committed, self.live):
            dst.copy_(src)
        return self._tree


def _rebuild(tree, it):
    if isinstance(tree, torch.Tensor):
        return next(it)
    return {k: _rebuild(v, it) for k, v in tree.items()}


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=4_000_000, help="model parameters (default 4M)")
    parser.add_argument("--steps", type=int, default=60, help="training steps per throughput loop")
    parser.add_argument("--every", type=int, default=20, help="checkpoint every N commits in the loop")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved throughput rounds")
    parser.add_argument("--repeat", type=int, default=15, help="samples of each commit timing")
    parser.add_argument("--dir", help="checkpoint directory (default: a temporary one)")
    parser.add_argument("--json", help="result file (default benchmarks/results/checkpoint_commit.json)")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    model, optimizer = build(args.params)
    committer = Committer(live_tensors(model, optimizer))
    nbytes = sum(t.numel() * t.element_size() for t in committer.committed)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        mgr = CheckpointManager(Path(tmp) / "due", every_commits=1, keep_last=2)
        copy_s = timed(committer.commit, args.repeat)
        snap = committer.commit()
        due_s, write_s = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            assert mgr.commit(snap, step=0)
            due_s.append(time.perf_counter() - t0)
            mgr.flush()
            write_s.append(time.perf_counter() - t0)
        idle = CheckpointManager(Path(tmp) / "idle", every_commits=10**9)
        idle_s = timed(lambda: idle.commit(snap), args.repeat * 20)
        mgr.close()
        idle.close()

        def loop(every: int | None) -> float:
            ckpt = CheckpointManager(Path(tmp) / f"loop-{every}", every_commits=every, keep_last=2) if every else None
            t0 = time.perf_counter()
            for i in range(args.steps):
                step(model, optimizer, 1024)
                snapshot = committer.commit()
                if ckpt is not None:
                    ckpt.commit(snapshot, step=i)
            elapsed = time.perf_counter() - t0
            if ckpt is not None:
                ckpt.close()
            return args.steps / elapsed

        loop(None)  # warm-up
        # Interleaved, so drift in machine load hits both alike.
        runs = [(loop(None), loop(args.every)) for _ in range(args.rounds)]
        plain = statistics.median(p for p, _ in runs)
        with_ckpt = statistics.median(c for _, c in runs)

    copy_ms = statistics.median(copy_s) * 1e3
    due_ms = statistics.median(due_s) * 1e3
    write = statistics.median(write_s)
    result = {
        "params": args.params, "snapshot_bytes": nbytes,
        "commit_copy_ms": copy_ms, "due_commit_ms": due_ms, "due_over_copy": due_ms / copy_ms,
        "idle_commit_us": statistics.median(idle_s) * 1e6,
        "background_write_s": write, "write_mb_per_s": nbytes / write / 1e6,
        "steps_per_s_plain": plain, "steps_per_s_checkpointing": with_ckpt,
        "throughput_ratio": with_ckpt / plain, "checkpoint_every": args.every,
    }
    rows = [
        ("snapshot size", f"{nbytes / 1e6:.1f} MB"),
        ("commit copy_ (baseline)", f"{copy_ms:.2f} ms"),
        ("due commit (staging copy)", f"{due_ms:.2f} ms  ({result['due_over_copy']:.2f}x baseline)"),
        ("idle commit", f"{result['idle_commit_us']:.1f} us"),
        ("background write", f"{write:.3f} s  ({result['write_mb_per_s']:.0f} MB/s)"),
        ("steps/s, commit every step", f"{plain:.2f}"),
        (f"steps/s, + checkpoint every {args.every}", f"{with_ckpt:.2f}  ({result['throughput_ratio']:.3f}x)"),
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
