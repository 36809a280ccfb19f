"""``hvd-elastic status``: the service's nodes as Consul sees them, and what discovery prints.

Reads ``GET /v1/health/service/:name`` WITHOUT ``?passing`` and applies the
very rules discovery applies (:func:`hvd_elastic.health.hosts.evaluate`,
same flags), so the last block is exactly what ``hvd-elastic discover`` would
print right now.  The host cache's flags (``--cache``, ``--cache-file``,
``--watch``...) are refused: status never reads or keeps a cache.  Exit
codes: 0 shown, 1 Consul failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hvd_elastic.commands import _discovery
from hvd_elastic.commands import discover as discovery_cli
from hvd_elastic.health import hosts as hostlib
from hvd_elastic.health import variables
from hvd_elastic.health.query import read_health
from hvd_elastic.options import consul_config

COLUMNS = ("HOST", "NODE", "SERVICE ID", "SLOTS", "HEALTH", "DISCOVERY")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Discovery's flags, less the host cache's: status always asks Consul, so those are refused."""
    discovery_cli.add_arguments(parser, cache=False)
    for flag in _discovery.cache_flags():
        # Refused by name, not left to argparse: "unrecognized arguments" would not say why.
        parser.add_argument(flag, nargs="?", action=_CacheFlag, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


class _CacheFlag(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is a host-cache flag of `hvd-elastic discover`; status reads no cache "
                     f"(it always asks Consul): drop it")


def render(decisions: Sequence[hostlib.Decision]) -> str:
    """The table and the discovery output, as text."""
    rows = [COLUMNS]
    for d in sorted(decisions, key=lambda d: (d.host, d.service_id)):
        shown = "listed" if d.accepted else f"dropped: {d.reason}"
        rows.append((d.host, d.node, d.service_id, "-" if d.slots is None else str(d.slots), d.health, shown))
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths)) + "  " + row[-1] for row in rows]
    found = hostlib.merge(decisions)
    lines.append("")
    lines.append(f"discovery prints ({len(found)} hosts, {sum(s for _, s in found)} slots):")
    lines.extend(f"  {host}:{slots}" for host, slots in found)
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    try:
        config = consul_config(args)
        found = variables.Settings.from_args(args)
        options, query = found.options(), found.health_query()
        entries = read_health(config, query, passing=False, timeout=args.timeout)[0]
        decisions = hostlib.evaluate(entries, options)
    except variables.FAILURES as exc:
        return _discovery.explain_failure(args, exc)
    print(f"service {args.service!r} at {config.base_url}: {len(decisions)} instances")
    if not decisions:
        discovery_cli.warn_if_nothing_matches(args, config, query)
    sys.stdout.write(render(decisions))
    return 0
