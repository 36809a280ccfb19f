"""``hvd-elastic discover`` and ``discovery/consul_hosts``: healthy hosts for horovodrun.

Prints one ``host:slots`` line per healthy node of the training service, from
``GET /v1/health/service/:name?passing``, for ``horovodrun
--host-discovery-script``.

Exit status and output (what horovodrun relies on):

* 0: stdout holds the complete host list (possibly empty) and nothing else.
* 1: Consul was unreachable, refused access, failed or answered garbage; one
  line on stderr says why and stdout stays EMPTY (never a partial list).
  horovodrun then keeps its previous host set (or, on the first call of a job,
  stops the job).
* 2: bad flags or environment.

Invalid entries (a host name that is no RFC 1123 name or IPv4 address, a slot
count that is no positive integer) are dropped with a warning on stderr.

Time: every call ends within ``--timeout`` seconds (default 0.8; horovodrun
calls it every second under a lock), except a job's first call, which retries
for up to ``--first-call-retry`` seconds while Consul is unreachable or has no
leader yet (see :mod:`hvd_elastic.discovery.firstcall`).
"""

from __future__ import annotations

import argparse
import sys

from hvd_elastic.config import ConsulConfig
from hvd_elastic.discovery import hosts as hostlib
from hvd_elastic.discovery.firstcall import FirstCall
from hvd_elastic.discovery.options import (
    ConfigError,
    add_consul_arguments,
    add_service_argument,
    argument_type,
    consul_config,
    env,
    env_list,
    non_negative_float,
    positive_float,
    positive_int,
)
from hvd_elastic.discovery.reader import ConsulError, check_not_hidden, get_json

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs time on this path
if TYPE_CHECKING:
    from typing import Any

_NAMINGS = [n.value for n in hostlib.HostNaming]
host_naming = argument_type(lambda text: hostlib.HostNaming(text).value, lambda _: True, f"one of {', '.join(_NAMINGS)}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_service_argument(parser)
    parser.add_argument("--tag", action="append", dest="tags", default=None, help="only instances carrying this tag; repeat for several, all must match (env HVD_ELASTIC_TAGS, comma-separated)")
    parser.add_argument("--filter", default=env("HVD_ELASTIC_FILTER"), help="Consul filter expression, e.g. 'Service.Meta.gpu_model == \"H100\"' (env HVD_ELASTIC_FILTER)")
    parser.add_argument("--slots-key", default=env("HVD_ELASTIC_SLOTS_KEY", "slots"), help="Service.Meta key holding the slot count (env HVD_ELASTIC_SLOTS_KEY; default %(default)s)")
    parser.add_argument("--default-slots", type=positive_int, default=env("HVD_ELASTIC_DEFAULT_SLOTS"), help="slots for instances without that Meta key (env HVD_ELASTIC_DEFAULT_SLOTS; default: such instances are dropped with a warning)")
    parser.add_argument("--max-slots-per-host", type=positive_int, default=env("HVD_ELASTIC_MAX_SLOTS_PER_HOST"), help="cap on the slots printed for one host (env HVD_ELASTIC_MAX_SLOTS_PER_HOST)")
    parser.add_argument("--host-name", type=host_naming, metavar="{" + ",".join(_NAMINGS) + "}", default=env("HVD_ELASTIC_HOST_NAME", hostlib.HostNaming.NODE.value), help="what names a host: the Consul node name, the service address (else the node address) or the node address (env HVD_ELASTIC_HOST_NAME; default %(default)s)")
    parser.add_argument("--exclude", action="append", default=None, metavar="HOST", help="never print this host; repeat for several (env HVD_ELASTIC_EXCLUDE, comma-separated)")
    parser.add_argument("--timeout", type=positive_float, default=env("HVD_ELASTIC_DISCOVERY_TIMEOUT", "0.8"), help="total seconds one call may take (env HVD_ELASTIC_DISCOVERY_TIMEOUT; default %(default)s)")
    parser.add_argument("--first-call-retry", type=non_negative_float, default=env("HVD_ELASTIC_DISCOVERY_FIRST_CALL_RETRY", "10"), metavar="SECONDS", help="how long a job's first call keeps retrying an unreachable or leaderless Consul; 0 disables (env HVD_ELASTIC_DISCOVERY_FIRST_CALL_RETRY; default %(default)s)")
    add_consul_arguments(parser)


def options_from_args(args: argparse.Namespace) -> hostlib.Options:
    """Discovery options from parsed flags (with their environment fallbacks)."""
    tags = args.tags if args.tags is not None else env_list("HVD_ELASTIC_TAGS")
    exclude = args.exclude if args.exclude is not None else env_list("HVD_ELASTIC_EXCLUDE")
    return hostlib.Options(
        slots_key=args.slots_key,
        default_slots=args.default_slots,
        max_slots_per_host=args.max_slots_per_host,
        naming=hostlib.HostNaming(args.host_name),
        exclude=frozenset(h.lower() for h in exclude),
        tags=tuple(tags),
    )


def health_query(args: argparse.Namespace, options: hostlib.Options, *, passing: bool) -> list[tuple[str, str]]:
    """Query parameters of ``/v1/health/service/:name`` for these options."""
    query = [("passing", "1")] if passing else []
    query += [("tag", tag) for tag in options.tags]
    if args.filter:
        query.append(("filter", args.filter))
    return query


def service_path(service: str) -> str:
    """The health endpoint of a service, its name quoted as one path segment."""
    from urllib.parse import quote

    return f"/v1/health/service/{quote(service, safe='')}"


def fetch_health(args: argparse.Namespace, config: ConsulConfig, options: hostlib.Options, *, passing: bool, retry_window: float = 0.0) -> Any:
    """The raw health entries of the service; raises ConsulError."""
    query = health_query(args, options, passing=passing)
    entries = get_json(config, service_path(args.service), query, timeout=args.timeout, retry_window=retry_window)
    return check_not_hidden(config, entries, args.timeout)


def discover(args: argparse.Namespace) -> tuple[list[tuple[str, int]], list[hostlib.Decision]]:
    """Ask Consul and decide; raises ConsulError, MalformedResponse or ConfigError."""
    config = consul_config(args)
    options = options_from_args(args)
    first_call = FirstCall(args.service)
    retry_window = args.first_call_retry if first_call.is_first else 0.0
    entries = fetch_health(args, config, options, passing=True, retry_window=retry_window)
    decisions = hostlib.evaluate(entries, options)
    first_call.record_success()
    return hostlib.merge(decisions), decisions


def warn_dropped(decisions: list[hostlib.Decision]) -> None:
    """Log one warning per instance dropped for invalid data (host name or slots)."""
    dropped = [d for d in decisions if d.warn]
    if dropped:
        import logging  # only when needed: this path runs every second under horovodrun

        log = logging.getLogger("hvd_elastic.discovery")
        for d in dropped:
            log.warning("discover: dropping instance %r on node %r: %s", d.service_id, d.node, d.reason)


FAILURES = (ConfigError, ConsulError, hostlib.MalformedResponse)


def explain_failure(command: str, service: str, exc: Exception) -> int:
    """Print one stderr line for a failure in FAILURES and return the exit code."""
    if isinstance(exc, hostlib.MalformedResponse):
        print(f"{command}: Consul's answer for service {service!r} is malformed: {exc}", file=sys.stderr)
    else:
        print(f"{command}: {exc}", file=sys.stderr)
    return 2 if isinstance(exc, ConfigError) else 1


def run(args: argparse.Namespace) -> int:
    try:
        found, decisions = discover(args)
    except FAILURES as exc:
        return explain_failure("discover", args.service, exc)
    warn_dropped(decisions)
    # One write of the complete list: a reader never sees a partial one.
    sys.stdout.write(hostlib.format_hosts(found))
    sys.stdout.flush()
    return 0


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter without its ``import shutil`` (and bz2, lzma) on every run."""

    def __init__(self, prog: str, **kwargs):
        if kwargs.get("width") is None:
            import os

            columns = os.environ.get("COLUMNS", "")
            if not columns.isdigit():
                try:
                    columns = os.get_terminal_size(sys.stdout.fileno()).columns
                except OSError:
                    columns = 80
            kwargs["width"] = max(int(columns) - 2, 40)
        super().__init__(prog, **kwargs)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``discovery/consul_hosts`` (no subcommand word)."""
    parser = argparse.ArgumentParser(
        prog="consul_hosts",
        description="Print healthy Consul hosts as host:slots lines for horovodrun --host-discovery-script.",
        formatter_class=_HelpFormatter,
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run(args)
