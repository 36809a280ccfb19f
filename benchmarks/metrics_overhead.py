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
                   separate scraper process reads it, every 15 s (the scrape
                   interval of Prometheus's example configuration) and, on a
                   port of its own, every ``--fast-scrape`` seconds (1 s by default).

Each sample is the wall time of ``--steps`` steps, timed inside the training
function (the session's set-up is not a step), and the CPU time the process
spent meanwhile (all its threads, so the exporter's thread is counted; the
scraper is another process): on a shared 2-core machine the wall time of the
same block varies by +-15%, the CPU time much less.  The three variants run in a
rotating order each round.  Target: metrics on <= 1.01x off.  Where the
machine's noise hides 1%, the last rows bound the cost from its parts: the CPU
of one whole scrape (an HTTP round trip from a client inside the process, so an
over-estimate) per second of training, and the bookkeeping per step.

    python benchmarks/metrics_overhead.py [--steps 500] [--rounds 40] [--hidden 512] [--fast-scrape 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import urllib.request
import subprocess
import sys
import time
from pathlib import Path

import horovod.torch as hvd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import hvd_elastic  # noqa: E402
from hvd_elastic.metrics.exporter import Exporter  # noqa: E402
from hvd_elastic.metrics.job import JobMetrics  # noqa: E402
from hvd_elastic.local import ports  # noqa: E402
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


def job_registry(metrics: JobMetrics):
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    registry.register(metrics)
    return registry


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=500, help="steps per sample (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=40, help="interleaved rounds (default %(default)s)")
    parser.add_argument("--hidden", type=int, default=512, help="MLP width (default %(default)s)")
    parser.add_argument("--fast-scrape", type=float, default=1.0, help="seconds between the fast variant's scrapes "
                                                                        "(default %(default)s)")
    parser.add_argument("--json", type=Path, default=RESULTS / "metrics_overhead.json")
    args = parser.parse_args(argv)
    for name in ("steps", "rounds", "hidden"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.fast_scrape <= 0:
        parser.error(f"--fast-scrape must be > 0, got {args.fast_scrape}")
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
    intervals = {"on": 15.0, "on_fast": args.fast_scrape}
    addresses = {variant: f"127.0.0.1:{port}" for variant, port in zip(intervals, ports.reserve(2))}

    def block(metrics_addr: str | None) -> tuple[float, float]:
        @hvd_elastic.run(metrics_addr=metrics_addr)
        def train(state):
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
                state.commit_step()
            return time.perf_counter() - t0, time.process_time() - c0

        return train(state)

    scrapers = [subprocess.Popen([sys.executable, "-c", SCRAPER, f"http://{addresses[v]}/metrics", str(intervals[v])])
                for v in intervals]
    try:
        variants = ("off", *intervals)
        for variant in variants:  # warm-up of every path
            block(addresses.get(variant))
        samples: dict[str, list[float]] = {v: [] for v in variants}
        cpu: dict[str, list[float]] = {v: [] for v in variants}
        for i in range(args.rounds):
            for variant in variants[i % 3:] + variants[:i % 3]:  # none always runs first
                wall, used = block(addresses.get(variant))
                samples[variant].append(wall)
                cpu[variant].append(used)
    finally:
        for scraper in scrapers:
            scraper.kill()
            scraper.wait()

    # The part that runs with metrics off too: the runner's bookkeeping of one commit.
    feed, metrics = [], JobMetrics()
    for i in range(2000):
        t0 = time.perf_counter()
        metrics.on_commit(0.001, i, i * 64)
        feed.append(time.perf_counter() - t0)
    # What one scrape costs the process at most: a whole HTTP round trip from a client in this process
    # (the client's own work included), to the exporter the runner uses.
    exporter = Exporter(job_registry(metrics), "benchmark")
    exporter.start("127.0.0.1:0", "benchmark")
    url = f"http://127.0.0.1:{exporter.address[1]}/metrics"
    scrape = []
    for _ in range(200):
        t0 = time.process_time()
        urllib.request.urlopen(url, timeout=5).read()
        scrape.append(time.process_time() - t0)
    exporter.stop()
    step = [t / args.steps for t in samples["off"]]
    scrape_s = statistics.median(scrape)
    rows = [
        Row(f"{args.steps} steps + commits, metrics off (baseline)", spread(samples["off"])),
        *(Row(f"{args.steps} steps + commits, metrics on, scraped every {intervals[v]:g} s", spread(samples[v]),
              baseline="metrics off", ratio=paired_ratio(samples[v], samples["off"]), target=1.01) for v in intervals),
        Row("  CPU time, metrics off (baseline)", spread(cpu["off"])),
        *(Row(f"  CPU time, metrics on, scraped every {intervals[v]:g} s", spread(cpu[v]), baseline="CPU, off",
              ratio=paired_ratio(cpu[v], cpu["off"]), target=1.01) for v in intervals),
        Row("one step + commit, metrics off", spread(step)),
        Row("the runner's metrics bookkeeping of one commit (always on)", spread(feed)),
        Row("CPU of one scrape, HTTP round trip in-process (an upper bound)", spread(scrape)),
        *(Row(f"  bound: scrape CPU per second of training, every {intervals[v]:g} s",
              spread([scrape_s / intervals[v] * 100]), unit="%") for v in intervals),
        Row("  bound: bookkeeping per step", spread([statistics.median(feed) / statistics.median(step) * 100]),
            unit="%"),
    ]
    params = sum(p.numel() for p in model.parameters())
    print(format_table(f"metrics overhead: MLP of {params / 1e6:.2f}M parameters + Adam, 1 torch thread, "
                       f"{load_note(load_at_start)}", rows))
    report = {"steps": args.steps, "rounds": args.rounds, "params": params, "scrape_interval_s": intervals,
              "rows": rows, "load_average_start": load_at_start, "samples_s": samples, "cpu_s": cpu}
    print(f"wrote {write_json(args.json, report)}")


if __name__ == "__main__":
    main()
