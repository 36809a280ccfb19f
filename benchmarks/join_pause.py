"""What a join costs the survivors: the pause from the last committed step at the old size to the first at the new.

Elastic horovodrun (Gloo, hosts ``localhost`` and ``127.0.0.1``, host-file
discovery) trains :mod:`testbed.worker` at two slots; a third slot
joins on ``127.0.0.1`` by a host-file edit.  Stock Horovod starts the joining
worker only after the survivors stopped at their commit, so they wait through
its whole start-up; hvd-elastic's join-ahead (``--join-ahead off`` measures
without it) lets them train on until it waits at its rendezvous.  Three modes,
interleaved round by round (the first alternates), same hosts, model and
horovodrun flags:

* horovod      -- stock Horovod elastic (``TorchState`` + ``ElasticSampler``), the
                  worker started directly, as horovodrun does;
* hvd-elastic  -- ``@hvd_elastic.run`` and its states, the worker started directly;
* standby      -- the same, with the command ``hvd-elastic exec -- python -m ...``
                  and an ``hvd-elastic standby`` that preloaded the worker's imports.

Each at two start-up costs, real imports in the worker (``--import``), not sleeps:
``light`` = torch + horovod only (about 3 s here), ``heavy`` = also
``torch._inductor.compile_fx`` (what a ``torch.compile`` script imports, about 10 s).

Reported per mode and cost: the survivors' pause, and the time from the
host-file edit (the newcomer "registering") to the first step with it;
ratios against ``horovod`` in the same round.  Also the whole-job relaunch
(every process SIGKILLed, horovodrun started again, the state resumed from its
checkpoint: seconds to the first committed step) for hvd-elastic with and
without the standby.  Writes ``benchmarks/results/join_pause.json``.

    .venv/bin/python benchmarks/join_pause.py [--rounds 3] [--costs light,heavy]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from report import RESULTS, Row, format_table, load_note, paired_ratio, spread, write_json

from hvd_elastic.training.checkpoint import CheckpointManager
from hvd_elastic.training.settings import JOIN_AHEAD_ENV

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: testbed/ is not installed
from testbed import (HVD_ELASTIC, JsonLines, Job, child_env, horovodrun_elastic, host_file_discovery,  # noqa: E402
                     wait_until)
from testbed.standby import StandbyProcess  # noqa: E402

MODES = ("horovod", "hvd-elastic", "standby")
COSTS = {"light": "", "heavy": "torch._inductor.compile_fx"}
BASE_IMPORTS = "psutil,torch.utils.data"  # the worker's own, beside torch and horovod.torch
TWO, THREE = "localhost:1\n127.0.0.1:1\n", "localhost:1\n127.0.0.1:2\n"
WAIT = 240.0  # every wait is bounded: a hang guard, not a speed bound


class Round:
    """One job of one mode and start-up cost: a join, then a whole-job relaunch (hvd-elastic modes)."""

    def __init__(self, out: Path, mode: str, cost: str, standby: StandbyProcess | None, join_ahead: bool):
        self.out, self.mode = out, mode
        out.mkdir(parents=True)
        self.hosts = out / "hosts"
        discover = host_file_discovery(self.hosts, TWO)
        worker = [sys.executable, "-m", "testbed.worker", "--out", str(out), "--step-sleep", "0.05",
                  "--checkpoint-every", "5", "--import", COSTS[cost],
                  *(["--api", "horovod"] if mode == "horovod" else [])]
        if standby is not None:
            worker = [HVD_ELASTIC, "exec", "--standby", standby.name, "--", *worker]
        env = standby.env if standby is not None else child_env()
        self.cmd = [*horovodrun_elastic(discover, 2, 1, 3), *worker]
        self.env = {**env, "HOROVOD_GLOO_TIMEOUT_SECONDS": "60", "HOROVOD_ELASTIC_TIMEOUT": "120",
                    JOIN_AHEAD_ENV: "1" if join_ahead else "0"}
        self.progress = JsonLines(out / "progress.jsonl")

    def _job(self) -> Job:
        return Job(self.cmd, logdir=self.out, name="horovodrun", env=self.env)

    def _first(self, size: int, since: float, job: Job) -> dict:
        def found():
            return next((r for r in self.progress.rows() if r["size"] == size and r["time"] > since), None)
        return wait_until(f"a committed step at size {size}", found, WAIT, interval=0.05, jobs=[job])

    def join(self) -> dict:
        with self._job() as job:
            job.start()
            self._first(2, 0.0, job)
            time.sleep(2.0)  # a steady world of two
            t0 = time.time()
            self.hosts.write_text(THREE)
            first = self._first(3, t0, job)
            last_old = max(r["time"] for r in self.progress.rows() if r["size"] == 2 and r["time"] < first["time"])
            sample = {"pause": first["time"] - last_old, "from_registration": first["time"] - t0,
                      "phases": self._phases(last_old, first["time"])}
            if self.mode != "horovod":
                sample["relaunch"] = self._relaunch(job)
            (self.out / "stop").touch()
            job.finish(WAIT)
        return sample

    def _phases(self, paused: float, resumed: float) -> dict:
        """The joiner's own times (``pids/*.json``), in seconds from the survivors' last commit at the old
        size: negative while they still trained (join-ahead), positive while they waited."""
        workers = [json.loads(path.read_text()) for path in (self.out / "pids").glob("*.json")]
        joiner = max(workers, key=lambda w: w["process_start"])
        return {"joiner started": joiner["process_start"] - paused,
                "joiner imported": joiner["imported"] - paused,
                "joiner initialised": joiner["initialised"] - paused,
                "first step at the new size": resumed - paused}

    def _relaunch(self, job: Job) -> float:
        """SIGKILL the whole job after a durable checkpoint; seconds from the new horovodrun to its first step."""
        ckpt = self.out / "ckpt"
        wait_until("a durable checkpoint", lambda: ckpt.is_dir() and CheckpointManager(ckpt).checkpoints(), WAIT,
                   jobs=[job])
        job.kill()
        self.hosts.write_text(TWO)
        t0 = time.time()
        job.start()
        return self._first(2, t0, job)["time"] - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="samples per mode and cost (default %(default)s)")
    parser.add_argument("--costs", default=",".join(COSTS), help="comma-separated subset of " + ",".join(COSTS))
    parser.add_argument("--join-ahead", choices=("on", "off"), default="on",
                        help="hvd-elastic's join-ahead (HVD_ELASTIC_JOIN_AHEAD; default %(default)s): off measures "
                             "the survivors stopping at once, as stock Horovod's do")
    parser.add_argument("--json", type=Path, default=RESULTS / "join_pause.json")
    args = parser.parse_args(argv)
    costs = args.costs.split(",")
    if args.rounds < 1 or any(c not in COSTS for c in costs):
        parser.error(f"--rounds must be >= 1 and --costs a subset of {','.join(COSTS)}")

    load_at_start = os.getloadavg()
    samples = {c: {m: [] for m in MODES} for c in costs}
    with tempfile.TemporaryDirectory(prefix="hvd-elastic-join-pause.") as tmp:
        for cost in costs:
            preload = ",".join(filter(None, [BASE_IMPORTS, COSTS[cost]]))
            with StandbyProcess(Path(tmp), f"bench-{cost}", "--preload", preload) as standby:
                standby.wait_ready()
                for r in range(args.rounds):
                    for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                        out = Path(tmp) / f"{cost}-{mode}-{r}"
                        sample = Round(out, mode, cost, standby if mode == "standby" else None,
                                       args.join_ahead == "on").join()
                        samples[cost][mode].append(sample)
                        print(f"round {r + 1} {cost:<6} {mode:<12} pause {sample['pause']:6.2f} s, "
                              f"registration -> first step {sample['from_registration']:6.2f} s"
                              + (f", relaunch {sample['relaunch']:6.2f} s" if "relaunch" in sample else ""), flush=True)

    rows = []
    for cost in costs:
        by_mode = samples[cost]
        base = [s["pause"] for s in by_mode["horovod"]]
        rows.append(Row(f"{cost}: survivors' pause, horovod", spread(base)))
        for mode in ("hvd-elastic", "standby"):
            pauses = [s["pause"] for s in by_mode[mode]]
            rows.append(Row(f"{cost}: survivors' pause, {mode}", spread(pauses), baseline=f"horovod, {cost}",
                            ratio=paired_ratio(pauses, base)))
        for mode in MODES:
            rows.append(Row(f"{cost}: registration -> first step, {mode}",
                            spread([s["from_registration"] for s in by_mode[mode]])))
        plain = [s["relaunch"] for s in by_mode["hvd-elastic"]]
        warm = [s["relaunch"] for s in by_mode["standby"]]
        rows.append(Row(f"{cost}: whole-job relaunch, hvd-elastic", spread(plain)))
        rows.append(Row(f"{cost}: whole-job relaunch, standby", spread(warm), baseline=f"hvd-elastic relaunch, {cost}",
                        ratio=paired_ratio(warm, plain)))
    print()
    for cost in costs:
        for mode in MODES:
            phases = [s["phases"] for s in samples[cost][mode]]
            print(f"{cost} {mode}, from the survivors' last commit at the old size (median s): " + ", ".join(
                f"{k} {statistics.median(p[k] for p in phases):.2f}" for k in phases[0]))
    print(format_table("a join on local hosts (localhost + 127.0.0.1), 2 -> 3 slots, join-ahead "
                       f"{args.join_ahead} ({load_note(load_at_start)})", rows))
    write_json(args.json, {"rounds": args.rounds, "join_ahead": args.join_ahead,
                           "costs": {c: COSTS[c] or "torch + horovod" for c in costs},
                           "samples": samples, "rows": rows})
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
