"""TrainingState vs Horovod's TorchState: commit, sync and training throughput.

One run measures, on the same model (an MLP of about 26M parameters with Adam,
so about 312 MB of parameters and moments) and two Gloo workers:

* commit: ``save()`` (the host copy) and ``commit()`` (save + Horovod's host
  check) against a plain ``copy_`` of the same tensors into preallocated
  buffers;
* sync: ``sync()`` against ONE ``hvd.broadcast_`` of a flat tensor of the
  same bytes;
* throughput: a training loop committing every step against the same loop
  without any state library.

Targets (ratios to the baseline measured in the same run): commit <= 1.2x,
sync <= 1.3x, throughput within 3%.

    python benchmarks/state_bench.py [--json PATH] [--steps N] [--batch B]

Without Horovod's environment the script starts itself under
``horovodrun -np 2 -H localhost:2``; rank 0 prints the table and writes JSON
(default ``benchmarks/results/state_bench.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_JSON = REPO / "benchmarks" / "results" / "state_bench.json"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where rank 0 writes the results")
    p.add_argument("--np", type=int, default=2, help="workers to launch (default 2)")
    p.add_argument("--width", type=int, default=4096, help="hidden width of the MLP (4096: ~26M parameters)")
    p.add_argument("--reps", type=int, default=7, help="repetitions of each commit/sync measurement")
    p.add_argument("--steps", type=int, default=6, help="training steps per throughput round")
    p.add_argument("--rounds", type=int, default=3, help="interleaved throughput rounds per variant")
    p.add_argument("--batch", type=int, default=512, help="per-worker batch of the throughput loop")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    return p.parse_args(argv)


def launch(args: argparse.Namespace) -> int:
    """Run this script under horovodrun and relay its exit code."""
    horovodrun = Path(sys.executable).parent / "horovodrun"
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cmd = [str(horovodrun), "--gloo", "-np", str(args.np), "-H", f"localhost:{args.np}",
           sys.executable, __file__, *sys.argv[1:]]
    return subprocess.call(cmd, env=env)


# -- measurements ----------------------------------------------------------------------------


def mlp(width: int):
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(1024, width), torch.nn.ReLU(),
        torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    )


class Bench:
    def __init__(self, args: argparse.Namespace):
        import torch
        import horovod.torch as hvd

        self.torch, self.hvd, self.args = torch, hvd, args
        torch.manual_seed(0)
        self.model = mlp(args.width)
        base = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.optimizer = hvd.DistributedOptimizer(base, named_parameters=self.model.named_parameters())
        self.x = torch.randn(args.batch, 1024)
        self.y = torch.randint(0, 10, (args.batch,))
        for _ in range(2):  # Adam's moments exist from here on
            self.step()
        self.barrier()

    def step(self) -> None:
        torch = self.torch
        self.optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(self.model(self.x), self.y)
        loss.backward()
        self.optimizer.step()

    def barrier(self) -> None:
        self.hvd.allreduce(self.torch.zeros(1), name="bench.barrier")

    def slowest(self, seconds: float) -> float:
        """The largest of every rank's time for the same operation."""
        t = self.torch.tensor([seconds], dtype=self.torch.float64)
        return self.hvd.allreduce(t, op=self.hvd.Max, name="bench.max").item()

    def timed(self, fn, reps: int | None = None) -> float:
        """Median over reps of the slowest rank's time of fn()."""
        times = []
        for _ in range(reps or self.args.reps):
            self.barrier()
            start = time.perf_counter()
            fn()
            times.append(self.slowest(time.perf_counter() - start))
        return statistics.median(times)

    def state_tensors(self) -> list:
        tensors = [t for t in self.model.state_dict().values()]
        for state in self.optimizer.state.values():
            tensors += [v for v in state.values() if self.torch.is_tensor(v)]
        return tensors

    def run(self) -> dict:
        torch, hvd = self.torch, self.hvd
        from hvd_elastic.training.state import TrainingState

        tensors = self.state_tensors()
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        params = sum(p.numel() for p in self.model.parameters())

        # commit ------------------------------------------------------------------------------
        copies = [torch.empty_like(t) for t in tensors]

        def plain_copy():
            for dst, src in zip(copies, tensors):
                dst.copy_(src)

        ours = TrainingState(model=self.model, optimizer=self.optimizer, epoch=0)
        theirs = hvd.elastic.TorchState(model=self.model, optimizer=self.optimizer, epoch=0)
        results = {
            "copy_": self.timed(plain_copy),
            "ours.save": self.timed(ours.save),
            "ours.commit": self.timed(ours.commit),
            "torchstate.save": self.timed(theirs.save),
            "torchstate.commit": self.timed(theirs.commit),
        }
        del copies

        # sync --------------------------------------------------------------------------------
        flat = torch.empty(nbytes // 4, dtype=torch.float32)
        results["broadcast_"] = self.timed(lambda: hvd.broadcast_(flat, 0, name="bench.flat"))
        del flat
        results["ours.sync"] = self.timed(ours.sync)
        results["torchstate.sync"] = self.timed(theirs.sync)

        # throughput: the variants interleaved so drift hits them alike ------------------------
        loops = {"loop": lambda: None, "ours.loop": ours.commit, "torchstate.loop": theirs.commit}
        per_step: dict[str, list[float]] = {k: [] for k in loops}
        for _ in range(self.args.rounds):
            for name, commit in loops.items():
                self.barrier()
                start = time.perf_counter()
                for _ in range(self.args.steps):
                    self.step()
                    commit()
                per_step[name].append(self.slowest(time.perf_counter() - start) / self.args.steps)
        for name, times in per_step.items():
            results[name] = statistics.median(times)

        return {
            "world_size": hvd.size(),
            "parameters": params,
            "state_bytes": nbytes,
            "torch_threads": torch.get_num_threads(),
            "batch": self.args.batch,
            "seconds": results,
            "ratios": {
                "ours.save/copy_": results["ours.save"] / results["copy_"],
                "ours.commit/copy_": results["ours.commit"] / results["copy_"],
                "torchstate.save/copy_": results["torchstate.save"] / results["copy_"],
                "torchstate.commit/copy_": results["torchstate.commit"] / results["copy_"],
                "ours.sync/broadcast_": results["ours.sync"] / results["broadcast_"],
                "torchstate.sync/broadcast_": results["torchstate.sync"] / results["broadcast_"],
                "ours.loop/loop": results["ours.loop"] / results["loop"],
                "torchstate.loop/loop": results["torchstate.loop"] / results["loop"],
            },
            "targets": {"ours.save/copy_": 1.2, "ours.sync/broadcast_": 1.3, "ours.loop/loop": 1.03},
        }


def table(report: dict) -> str:
    s, r = report["seconds"], report["ratios"]
    rows = [
        ("commit (host copy)", "copy_", s["copy_"], s["ours.save"], r["ours.save/copy_"],
         s["torchstate.save"], r["torchstate.save/copy_"], "<= 1.2x"),
        ("commit (+host check)", "copy_", s["copy_"], s["ours.commit"], r["ours.commit/copy_"],
         s["torchstate.commit"], r["torchstate.commit/copy_"], ""),
        (f"sync, {report['world_size']} workers", "broadcast_", s["broadcast_"], s["ours.sync"],
         r["ours.sync/broadcast_"], s["torchstate.sync"], r["torchstate.sync/broadcast_"], "<= 1.3x"),
        ("train step + commit", "no library", s["loop"], s["ours.loop"], r["ours.loop/loop"],
         s["torchstate.loop"], r["torchstate.loop/loop"], "<= 1.03x"),
    ]
    head = (f"{report['parameters'] / 1e6:.1f}M-parameter MLP + Adam, {report['state_bytes'] / 2**20:.0f} MiB of state, "
            f"{report['world_size']} Gloo workers, batch {report['batch']}, {report['torch_threads']} torch thread(s)")
    lines = [head, f"{'measure':22} {'baseline':>11} {'base s':>8} {'ours s':>8} {'ours x':>7} "
                   f"{'TorchState s':>13} {'TS x':>6}  target"]
    for name, base, b, o, ox, t, tx, target in rows:
        lines.append(f"{name:22} {base:>11} {b:8.4f} {o:8.4f} {ox:6.2f}x {t:13.4f} {tx:5.2f}x  {target}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if "HOROVOD_RANK" not in os.environ:
        return launch(args)
    import torch
    import horovod.torch as hvd

    torch.set_num_threads(args.threads)
    hvd.init()
    report = Bench(args).run()
    if hvd.rank() == 0:
        print(table(report), flush=True)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
