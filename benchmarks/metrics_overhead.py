"""What serving the job's Prometheus metrics costs a training step.

One process (``hvd.init()`` without a launcher: a world of one, which is rank 0,
the process that serves), a TrainingState over an MLP with Adam, a commit every
step under ``@hvd_elastic.run``, both variants in the same process, interleaved
round by round:

* metrics off   -- no ``metrics_addr`` and no ``HVD_ELASTIC_METRICS_ADDR``: the
                   default, and the baseline.  (The runner still keeps the job's
                   numbers, a few dictionary updates per commit; the last row
                   times that on its own.)
* metrics on    -- ``metrics_addr`` set: rank 0 serves ``/metrics`` while a
                   separate scraper process reads it every ``--scrape-interval``
                   seconds (1 s by default, 15 times Prometheus's default rate).

Each sample is the wall time of ``--steps`` steps, timed inside the training
function (the session's set-up is not a step).  Target: metrics on <= 1.01x off.

    python benchmarks/metrics_overhead.py [--steps 200] [--rounds 10] [--hidden 512] [--scrape-interval 1]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import horovod.torch as hvd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import hvd_elastic  # noqa: E402
from hvd_elastic.metrics.job import JobMetrics  # noqa: E402
from hvd_elastic.testbed import ports  # noqa: E402
from report import RESULTS, Row, format_table, load_note, paired_ratio, spread, write_json  # noqa: E402

SCRAPER = """
import sys, time, urllib.request
url, interval = sys.argv[1], float(sys.argv[2])
while True:
    try:
        urllib.request.urlopen(url, timeout=5).read()
    except OSError:
        pass  # between rounds nothing serves
    time.sleep(interval)
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200, help="steps per sample (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds (default %(default)s)")
    parser.add_argument("--hidden", type=int, default=512, help="MLP width (default %(default)s)")
    parser.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between scrapes (default %(default)s)")
    parser.add_argument("--json", type=Path, default=RESULTS / "metrics_overhead.json")
    args = parser.parse_args(argv)
    for name in ("steps", "rounds", "hidden"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.scrape_interval <= 0:
        parser.error(f"--scrape-interval must be > 0, got {args.scrape_interval}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.pop("HVD_ELASTIC_METRICS_ADDR", None)
    load_at_start = os.getloadavg()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    hvd.init()
    model = torch.nn.Sequential(torch.nn.Linear(256, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    state = hvd_elastic.TrainingState(model=model, optimizer=optimizer, step=0)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    port = ports.reserve()[0]
    address = f"127.0.0.1:{port}"

    def block(metrics_addr: str | None) -> float:
        @hvd_elastic.run(metrics_addr=metrics_addr)
        def train(state):
            t0 = time.perf_counter()
            for _ in range(args.steps):
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
                state.commit_step()
            return time.perf_counter() - t0

        return train(state)

    scraper = subprocess.Popen([sys.executable, "-c", SCRAPER, f"http://{address}/metrics", str(args.scrape_interval)])
    try:
        block(None)
        block(address)  # warm-up of both paths
        samples: dict[str, list[float]] = {"off": [], "on": []}
        for i in range(args.rounds):
            order = ("off", "on") if i % 2 == 0 else ("on", "off")  # neither always runs first
            for variant in order:
                samples[variant].append(block(address if variant == "on" else None))
    finally:
        scraper.kill()
        scraper.wait()

    # The part that runs with metrics off too: the runner's bookkeeping of one commit.
    feed, metrics = [], JobMetrics()
    for i in range(2000):
        t0 = time.perf_counter()
        metrics.on_commit(0.001, i, i * 64)
        feed.append(time.perf_counter() - t0)
    step = [t / args.steps for t in samples["off"]]
    rows = [
        Row(f"{args.steps} steps + commits, metrics off (baseline)", spread(samples["off"])),
        Row(f"{args.steps} steps + commits, metrics on, scraped every {args.scrape_interval:g} s",
            spread(samples["on"]), baseline="metrics off", ratio=paired_ratio(samples["on"], samples["off"]),
            target=1.01),
        Row("one step + commit, metrics off", spread(step)),
        Row("the runner's metrics bookkeeping of one commit (always on)", spread(feed)),
    ]
    params = sum(p.numel() for p in model.parameters())
    print(format_table(f"metrics overhead: MLP of {params / 1e6:.2f}M parameters + Adam, 1 torch thread, "
                       f"{load_note(load_at_start)}", rows))
    report = {"steps": args.steps, "rounds": args.rounds, "params": params, "scrape_interval_s": args.scrape_interval,
              "rows": rows, "load_average_start": load_at_start, "samples_s": samples}
    print(f"wrote {write_json(args.json, report)}")


if __name__ == "__main__":
    main()
