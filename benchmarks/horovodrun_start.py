"""How long horovodrun takes from its start to its workers' start: what every relaunch of a job pays first.

Each round runs three elastic horovodruns on two local hosts (``localhost``,
``127.0.0.1``, one slot each, ``-np 2``), in a fixed order, and times from
starting ``horovodrun`` to the moment its last worker runs (the worker is
``sh -c 'date +%s.%N'`` into a file, so the worker's own start-up is not in
the figure), and the CPU seconds (user and system) horovodrun and every
process under it used for the whole run (this process adopts the orphans,
so a forkserver's children count too), which on a loaded 2-core box are
what a relaunch takes from the training that goes on:

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
import ctypes
import os
import resource
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
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def one_start(workdir: Path, kind: str, warm_cache: Path) -> tuple[float, float]:
    """Seconds from starting horovodrun to its last worker's start, and the CPU seconds of its whole tree."""
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
    began, cpu = time.time(), _children_cpu()
    subprocess.run([str(VENV_BIN / "horovodrun"), "-np", "2", "--min-np", "2", "--max-np", "2",
                    "--network-interface", "lo", "--host-discovery-script", str(hosts), "sh", "-c", worker],
                   env=env, check=True, capture_output=True, timeout=TIMEOUT_S)
    _reap_orphans()
    return max(float(path.read_text()) for path in stamps.iterdir()) - began, _children_cpu() - cpu


def _children_cpu() -> float:
    """CPU seconds of this process's reaped descendants: with :func:`_subreaper`, the whole tree's."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _subreaper() -> None:
    """Adopt horovodrun's orphans (a forkserver outlives horovodrun briefly, and its children are its own):
    reaped here, their CPU counts in RUSAGE_CHILDREN too."""
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _reap_orphans(timeout: float = TIMEOUT_S) -> None:
    """Wait for every adopted descendant to end."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.02)
    raise TimeoutError(f"horovodrun's processes still alive {timeout:.0f} s after it ended")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds (default %(default)s)")
    parser.add_argument("--json", type=Path, default=RESULTS / "horovodrun_start.json")
    args = parser.parse_args()
    _subreaper()
    load = os.getloadavg()
    samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
    cpu: dict[str, list[float]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory(prefix="hvd-start-") as tmp:
        workdir = Path(tmp)
        warm = workdir / "warm-cache"
        one_start(workdir, "hvd-elastic, first run", warm)  # fills nothing: the first run has its own cache
        one_start(workdir, "hvd-elastic", warm)  # fills the warm cache
        for _ in range(args.rounds):
            for kind in KINDS:
                wall, used = one_start(workdir, kind, warm)
                samples[kind].append(wall)
                cpu[kind].append(used)
    rows = []
    for measure, values in (("horovodrun start -> last worker", samples), ("CPU of horovodrun's tree", cpu)):
        rows.append(Row(f"{measure}: stock", spread(values["stock"])))
        rows += [Row(f"{measure}: {kind}", spread(values[kind]), baseline="stock",
                     ratio=paired_ratio(values[kind], values["stock"])) for kind in KINDS[1:]]
    print(format_table(f"elastic horovodrun, 2 local hosts ({load_note(load)})", rows))
    report = {"rows": rows, "samples": samples, "cpu_s": cpu, "rounds": args.rounds}
    print(f"json: {write_json(args.json, report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
