"""How long horovodrun takes from its start to its workers' start: what every relaunch of a job pays first.

Each round runs three elastic horovodruns on two local hosts (``localhost``,
``127.0.0.1``, one slot each, ``-np 2``), in a fixed order, and times from
starting ``horovodrun`` to the moment its last worker runs (the worker is
``sh -c 'date +%s.%N'`` into a file, so the worker's own start-up is not in
the figure):

* ``stock``: ``HVD_ELASTIC_DRIVER=0``, Horovod 0.28.1 as it is;
* ``hvd-elastic``: ``HVD_ELASTIC_DRIVER=1``, a warm cache (the case of every
  relaunch: :mod:`hvd_elastic.horovodrun.startup`);
* ``hvd-elastic, first run``: the same with an empty ``XDG_CACHE_HOME``, as
  the first horovodrun of a fresh environment.

Ratios are taken round by round against ``stock`` (``report.paired_ratio``).

    python benchmarks/horovodrun_start.py [--rounds 10] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: testbed/ is not installed
sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import RESULTS, Row, format_table, load_note, paired_ratio, spread, write_json  # noqa: E402
from testbed import VENV_BIN, child_env  # noqa: E402

KINDS = ("stock", "hvd-elastic", "hvd-elastic, first run")
TIMEOUT_S = 120.0  # a hang guard


def one_start(workdir: Path, kind: str, warm_cache: Path) -> float:
    """Seconds from starting horovodrun to its last worker's start, for ``kind``."""
    hosts = workdir / "hosts.sh"
    hosts.write_text("#!/bin/sh\necho localhost:1\necho 127.0.0.1:1\n")
    hosts.chmod(0o755)
    stamps = workdir / "stamps"
    stamps.mkdir(exist_ok=True)
    for old in stamps.iterdir():
        old.unlink()
    cache = warm_cache if kind == "hvd-elastic" else Path(tempfile.mkdtemp(dir=workdir))
    env = child_env(HVD_ELASTIC_DRIVER="0" if kind == "stock" else "1", XDG_CACHE_HOME=str(cache))
    worker = f'date +%s.%N > {stamps}/"$HOROVOD_RANK"'
    began = time.time()
    subprocess.run([str(VENV_BIN / "horovodrun"), "-np", "2", "--min-np", "2", "--max-np", "2",
                    "--network-interface", "lo", "--host-discovery-script", str(hosts), "sh", "-c", worker],
                   env=env, check=True, capture_output=True, timeout=TIMEOUT_S)
    return max(float(path.read_text()) for path in stamps.iterdir()) - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds (default %(default)s)")
    parser.add_argument("--json", type=Path, default=RESULTS / "horovodrun_start.json")
    args = parser.parse_args()
    load = os.getloadavg()
    samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory(prefix="hvd-start-") as tmp:
        workdir = Path(tmp)
        warm = workdir / "warm-cache"
        one_start(workdir, "hvd-elastic, first run", warm)  # fills nothing: the first run has its own cache
        one_start(workdir, "hvd-elastic", warm)  # fills the warm cache
        for _ in range(args.rounds):
            for kind in KINDS:
                samples[kind].append(one_start(workdir, kind, warm))
    rows = [Row("horovodrun start -> last worker: stock", spread(samples["stock"]))]
    rows += [Row(f"horovodrun start -> last worker: {kind}", spread(samples[kind]), baseline="stock",
                 ratio=paired_ratio(samples[kind], samples["stock"])) for kind in KINDS[1:]]
    print(format_table(f"elastic horovodrun, 2 local hosts ({load_note(load)})", rows))
    print(f"json: {write_json(args.json, {'rows': rows, 'samples': samples, 'rounds': args.rounds})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
