"""The long chaos soak: one elastic job on netns hosts under hundreds of random, overlapping faults.

Runs :class:`testbed.chaos.Soak` (see its module for the fault
kinds, the schedule, and the verdict) on HashiCorp Consul (a client agent in
every host) or the dev agent, with the user's defaults where the bed allows:
the Gloo timeout Horovod ships (30 s), OpenSSH's client settings (no
keep-alives), the lost-host cut on.  The node agents' TTL is the bed's 3 s.
Prints the summary table (per fault kind: injected, skipped, resets it caused,
recovery p50/p90/max) with the verdict, and writes
``benchmarks/results/chaos_soak.json``; the run's files stay in ``--keep`` if
given (``hvd-elastic report DIR/soak`` draws its timeline).  Exit status 0 when
the verdict holds, 1 when it does not, 2 on bad arguments.

    sudo .venv/bin/python benchmarks/chaos_soak.py --faults 200 [--mtbf 15] [--seed N]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from report import RESULTS, load_note, write_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: testbed/ is not installed
from testbed.chaos import FAULTS, Soak, SoakConfig, SoakFailure, format_summary  # noqa: E402
from testbed.multihost import ElasticCluster  # noqa: E402
from testbed.netns import unavailable_reason  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", type=int, default=200, help="faults to inject (default %(default)s)")
    parser.add_argument("--mtbf", type=float, default=15.0, help="mean seconds between faults (default %(default)s)")
    parser.add_argument("--seed", type=int, help="the schedule's seed (default: a random one, printed)")
    parser.add_argument("--hosts", type=int, default=4, help="netns hosts, one slot each (default %(default)s)")
    parser.add_argument("--min-np", type=int, default=2, help="horovodrun --min-np (default %(default)s)")
    parser.add_argument("--kinds", default=",".join(FAULTS), help="comma-separated subset of " + ",".join(FAULTS))
    parser.add_argument("--consul", choices=("consul", "dev"), default="consul",
                        help="HashiCorp Consul agents, or the dev agent (default %(default)s)")
    parser.add_argument("--max-impaired", type=int, help="hosts impaired at once (default: hosts - min-np)")
    parser.add_argument("--below-min-np", action="store_true",
                        help="allow faults to take the job below --min-np (it must wait for a host to come back)")
    parser.add_argument("--stall-timeout", type=float, default=180.0,
                        help="hvd-elastic launch --stall-timeout: a job this long without a commit is ended and "
                             "relaunched (default %(default)s; 0: never)")
    parser.add_argument("--relaunches", type=int, default=50,
                        help="times horovodrun may die and be relaunched, as a scheduler would (default %(default)s)")
    parser.add_argument("--plain", action="store_true",
                        help="the user's plain command: horovodrun alone as README gives it, without "
                             "--blacklist-cooldown-range or hvd-elastic launch (the soak fails when the job ends)")
    parser.add_argument("--keep", type=Path, help="keep the run's files in this directory (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=RESULTS / "chaos_soak.json")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(3), "big")
    try:
        config = SoakConfig(seed=seed, faults=args.faults, mtbf=args.mtbf, hosts=args.hosts, max_hosts=args.hosts + 1,
                            min_np=args.min_np, kinds=tuple(args.kinds.split(",")),
                            relaunches=args.relaunches, max_impaired=args.max_impaired,
                            below_min_np=args.below_min_np, stall_timeout=args.stall_timeout,
                            plain=args.plain).validate()
    except ValueError as exc:
        parser.error(str(exc))
    # SIGTERM (a timeout, a scheduler) unwinds like Ctrl-C, so the bed and its Consul agents are torn down.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    reason = unavailable_reason()
    if reason:
        print(f"chaos_soak: cannot run: {reason}", file=sys.stderr)
        return 1
    print(f"chaos soak: seed {seed}, {config.faults} faults every ~{config.mtbf:g} s on {config.hosts} hosts "
          f"({args.consul} Consul)", flush=True)
    load_at_start, began = os.getloadavg(), time.time()
    with tempfile.TemporaryDirectory(prefix="hvd-elastic-soak.") as tmp:
        workdir = args.keep or Path(tmp)
        with ElasticCluster(workdir, hosts=config.hosts, ttl=config.ttl, gloo_timeout=config.gloo_timeout,
                            consul=args.consul, ssh_keepalive=False) as cluster:
            cluster.wait_discovered([f"{h}:1" for h in cluster.bed.hosts])
            soak = Soak(cluster, config)
            try:
                soak.start()
                soak.run()
            except SoakFailure as exc:
                print(f"chaos soak seed {seed}: the job did not survive: {str(exc).splitlines()[0]}", file=sys.stderr)
                summary = {"failure": str(exc), **soak.counts}
                write_json(args.json, {"seed": seed, "config": vars(config), **summary})
                return 1
            summary = soak.finish()
    summary["seconds"] = time.time() - began
    print()
    print(f"chaos soak, seed {seed}, {args.consul} Consul, {config.hosts} hosts ({load_note(load_at_start)})")
    print(format_summary(summary))
    for line in summary["slow"]:
        print(f"not recovered within {config.bound:.0f} s: {line}")
    for problem in summary["problems"]:
        print(f"problem: {problem}")
    write_json(args.json, {"config": vars(config), "consul": args.consul, **summary})
    return 1 if summary["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
