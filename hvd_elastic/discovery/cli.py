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
count that is no positive integer or exceeds ``--max-slots-per-host``) are
dropped with a warning on stderr.

Host cache (``--cache auto``, the default): a call answers from the job's
cache file when it is fresh (:mod:`.fast`, :mod:`.cache`); otherwise it
queries Consul directly as below and, when horovodrun runs it (``--cache on``:
any parent process) and stdout is no terminal, starts the job's watcher
(:mod:`.watch`), whose single blocking query keeps the file fresh until
horovodrun exits.  ``--cache-file PATH`` reads an operator's
cache (``--watch --cache-file PATH`` keeps one fresh) instead.  A cache the
watcher cannot vouch for is never printed: the call falls back to the direct
query.

Time: every direct call ends within ``--timeout`` seconds (default 0.8;
horovodrun calls it every second under a lock), except a job's first call,
which retries for up to ``--first-call-retry`` seconds while Consul is
unreachable or has no leader yet (see :mod:`hvd_elastic.discovery.firstcall`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from hvd_elastic.config import ConsulConfig
from hvd_elastic.discovery import cache, fast, jobdir
from hvd_elastic.discovery import hosts as hostlib
from hvd_elastic.discovery.firstcall import FirstCall
from hvd_elastic.discovery.options import (
    ConfigError,
    add_consul_arguments,
    add_service_argument,
    argument_type,
    boolean,
    consul_config,
    env,
    env_list,
    non_negative_float,
    positive_float,
    positive_int,
)
from hvd_elastic.discovery.reader import ConsulError, check_not_hidden, get_answer

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs time on this path
if TYPE_CHECKING:
    from typing import Any

_NAMINGS = [n.value for n in hostlib.HostNaming]
host_naming = argument_type(lambda text: hostlib.HostNaming(text).value, lambda _: True, f"one of {', '.join(_NAMINGS)}")


cache_mode = argument_type(lambda text: text if text in ("auto", "on", "off") else None, lambda _: True, "one of auto, on, off")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    one_line_errors(parser)
    add_service_argument(parser)
    parser.add_argument("--tag", action="append", dest="tags", default=None, help="only instances carrying this tag; repeat for several, all must match (env HVD_ELASTIC_TAGS, comma-separated)")
    parser.add_argument("--filter", default=env("HVD_ELASTIC_FILTER"), help="Consul filter expression, e.g. 'Service.Meta.gpu_model == \"H100\"' (env HVD_ELASTIC_FILTER)")
    parser.add_argument("--slots-key", default=env("HVD_ELASTIC_SLOTS_KEY", "slots"), help="Service.Meta key holding the slot count (env HVD_ELASTIC_SLOTS_KEY; default %(default)s)")
    parser.add_argument("--default-slots", type=positive_int, default=env("HVD_ELASTIC_DEFAULT_SLOTS"), help="slots for instances without that Meta key (env HVD_ELASTIC_DEFAULT_SLOTS; default: such instances are dropped with a warning)")
    parser.add_argument("--max-slots-per-host", type=positive_int, default=env("HVD_ELASTIC_MAX_SLOTS_PER_HOST", str(hostlib.DEFAULT_MAX_SLOTS)), help="largest valid slot count; an instance advertising more is dropped with a warning (env HVD_ELASTIC_MAX_SLOTS_PER_HOST; default %(default)s)")
    parser.add_argument("--host-name", type=host_naming, metavar="{" + ",".join(_NAMINGS) + "}", default=env("HVD_ELASTIC_HOST_NAME", hostlib.HostNaming.NODE.value), help="what names a host: the Consul node name, the service address (else the node address) or the node address (env HVD_ELASTIC_HOST_NAME; default %(default)s)")
    parser.add_argument("--exclude", action="append", default=None, metavar="HOST", help="never print this host; repeat for several (env HVD_ELASTIC_EXCLUDE, comma-separated)")
    parser.add_argument("--timeout", type=positive_float, default=env("HVD_ELASTIC_DISCOVERY_TIMEOUT", "0.8"), help="total seconds one call may take (env HVD_ELASTIC_DISCOVERY_TIMEOUT; default %(default)s)")
    parser.add_argument("--first-call-retry", type=non_negative_float, default=env("HVD_ELASTIC_DISCOVERY_FIRST_CALL_RETRY", "10"), metavar="SECONDS", help="how long a job's first call keeps retrying an unreachable or leaderless Consul; 0 disables (env HVD_ELASTIC_DISCOVERY_FIRST_CALL_RETRY; default %(default)s)")
    parser.add_argument("--stale", type=boolean, nargs="?", const=True, default=env("HVD_ELASTIC_STALE", "false"), help="let any Consul server answer (?stale), spreading the load off the leader; answers staler than --max-stale fail (env HVD_ELASTIC_STALE; default %(default)s)")
    parser.add_argument("--max-stale", type=positive_float, default=env("HVD_ELASTIC_MAX_STALE", "5"), metavar="SECONDS", help="with --stale, the largest X-Consul-LastContact accepted (env HVD_ELASTIC_MAX_STALE; default %(default)s)")
    add_consul_arguments(parser)
    add_cache_arguments(parser)


def one_line_errors(parser: argparse.ArgumentParser) -> None:
    """Bad input is ONE stderr line naming the value and what was expected (no usage block), exit 2."""

    def error(message: str):
        parser.exit(2, f"{parser.prog}: error: {message}\n")

    parser.error = error


def add_cache_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("host cache (see discovery/README.md)")
    group.add_argument("--cache", type=cache_mode, metavar="{auto,on,off}", default=env("HVD_ELASTIC_DISCOVERY_CACHE", "auto"), help="auto: answer from a fresh cache, starting the job's watcher on its first call when horovodrun runs this; on: also under any other parent process (tests, other launchers); off: always query Consul (env HVD_ELASTIC_DISCOVERY_CACHE; default %(default)s)")
    group.add_argument("--cache-file", metavar="PATH", default=env("HVD_ELASTIC_DISCOVERY_CACHE_FILE"), help="read the cache an operator's `discover --watch --cache-file PATH` keeps fresh (env HVD_ELASTIC_DISCOVERY_CACHE_FILE)")
    group.add_argument("--watch", action="store_true", help="keep --cache-file fresh with one blocking query until stopped (SIGTERM)")
    group.add_argument("--watch-wait", type=positive_float, default=env("HVD_ELASTIC_DISCOVERY_WATCH_WAIT", "60"), metavar="SECONDS", help="the blocking query's ?wait= (env HVD_ELASTIC_DISCOVERY_WATCH_WAIT; default %(default)s)")
    group.add_argument("--cache-max-age", type=positive_float, default=env("HVD_ELASTIC_DISCOVERY_CACHE_MAX_AGE"), metavar="SECONDS", help="freshness bound: a cache whose last Consul answer is older is not used (env HVD_ELASTIC_DISCOVERY_CACHE_MAX_AGE; default the wait plus its 1/16 jitter plus 5 s)")
    # Set by ensure_running for the job's own watcher, never by hand.
    group.add_argument("--cache-key", help=argparse.SUPPRESS)
    group.add_argument("--job", type=job_type, help=argparse.SUPPRESS)


job_type = argument_type(lambda text: tuple(text.split("-", 1)) if text.split("-", 1)[0].isdigit() else None, lambda v: len(v) == 2, "PID-START")


def cache_max_age(args: argparse.Namespace) -> float:
    """The freshness bound: explicit, or a few seconds beyond the longest a blocking query may park."""
    return args.cache_max_age or args.watch_wait * 17 / 16 + 5.0


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
    if args.stale:
        query.append(("stale", ""))
    return query


def service_path(service: str) -> str:
    """The health endpoint of a service, its name quoted as one path segment."""
    from urllib.parse import quote

    return f"/v1/health/service/{quote(service, safe='')}"


def fetch_health(args: argparse.Namespace, config: ConsulConfig, options: hostlib.Options, *, passing: bool, retry_window: float = 0.0) -> Any:
    """The raw health entries of the service; raises ConsulError."""
    return query_health(args, config, options, passing=passing, retry_window=retry_window)[0]


def query_health(
    args: argparse.Namespace, config: ConsulConfig, options: hostlib.Options, *, passing: bool,
    retry_window: float = 0.0, index: int = 0, wait: float = 0.0, timeout: float | None = None, retry: bool = True,
) -> tuple[Any, dict[str, str]]:
    """(raw health entries, answer headers); a blocking read with ``index`` > 0.  Raises ConsulError.

    With ``--stale`` an answer whose ``X-Consul-LastContact`` exceeds
    ``--max-stale`` (or that does not say) is a retryable failure.
    """
    query = health_query(args, options, passing=passing)
    if index > 0:
        query += [("index", str(index)), ("wait", f"{wait:g}s")]
    timeout = args.timeout if timeout is None else timeout
    entries, headers = get_answer(config, service_path(args.service), query, timeout=timeout, retry_window=retry_window, retry=retry)
    if args.stale:
        contact = headers.get("x-consul-lastcontact", "")
        if not contact.isdigit():
            raise ConsulError(f"Consul at {config.base_url} gave a ?stale answer without X-Consul-LastContact", retryable=True)
        if int(contact) > args.max_stale * 1000:
            raise ConsulError(f"Consul at {config.base_url} answered from a server {int(contact) / 1000:g} s behind its leader (--max-stale {args.max_stale:g})", retryable=True)
    return check_not_hidden(config, entries, timeout), headers


def discover(args: argparse.Namespace, config: ConsulConfig, options: hostlib.Options) -> tuple[list[tuple[str, int]], list[hostlib.Decision]]:
    """Ask Consul and decide; raises ConsulError, MalformedResponse or ConfigError."""
    first_call = FirstCall(args.service)
    retry_window = args.first_call_retry if first_call.is_first else 0.0
    entries = fetch_health(args, config, options, passing=True, retry_window=retry_window)
    decisions = hostlib.evaluate(entries, options)
    first_call.record_success()
    return hostlib.merge(decisions), decisions


WATCH_PLAIN_READ_TIMEOUT_S = 10.0  # the watcher holds no horovodrun lock: a large answer may take its time
WATCH_SLACK_S = 10.0  # beyond wait + jitter, for the server to render and send a large answer


def watch_fetch(args: argparse.Namespace, config: ConsulConfig, options: hostlib.Options):
    """The watcher's ``fetch(index)``: (decisions, X-Consul-Index, monotonic answer time)."""

    def fetch(index: int) -> tuple[list[hostlib.Decision], int, float]:
        wait = args.watch_wait
        timeout = wait * 17 / 16 + WATCH_SLACK_S if index else max(args.timeout, WATCH_PLAIN_READ_TIMEOUT_S)
        entries, headers = query_health(args, config, options, passing=True, index=index, wait=wait, timeout=timeout, retry=False)
        answered = time.monotonic()
        raw_index = headers.get("x-consul-index", "")
        if not raw_index.isdigit():
            raise ConsulError(f"Consul at {config.base_url} answered without an X-Consul-Index: cannot block on it", retryable=True)
        return hostlib.evaluate(entries, options), int(raw_index), answered

    return fetch


def fingerprint(args: argparse.Namespace, config: ConsulConfig, options: hostlib.Options) -> str:
    """What an operator's cache must have been written for: every setting that shapes the output."""
    settings = (config.base_url, config.datacenter, args.service, options.tags, args.filter, args.stale,
                args.max_stale if args.stale else None, options.slots_key, options.default_slots,
                options.max_slots_per_host, options.naming.value, sorted(options.exclude))
    return "settings-" + cache.sha256_hex(repr(settings).encode())


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


def raw_argv(args: argparse.Namespace) -> list[str]:
    """The discovery arguments as given, which key the job's cache (see :mod:`.fast`)."""
    if getattr(args, "raw_argv", None) is not None:
        return args.raw_argv
    argv = sys.argv[1:]  # hvd-elastic [global options] discover ARGS
    return argv[argv.index("discover") + 1:] if "discover" in argv else argv


def operator_cache(args: argparse.Namespace, config: ConsulConfig, options: hostlib.Options) -> cache.Record | None:
    """The operator's cache (--cache-file) when it is fresh and written for these settings."""
    try:
        rec = cache.load(args.cache_file, fingerprint(args, config, options), (os.getuid(), 0))
    except cache.CacheInvalid as exc:
        print(f"discover: ignoring the host cache {args.cache_file}: {exc}", file=sys.stderr)
        return None
    return rec if rec is not None and cache.untrusted_reason(rec) is None else None


def start_job_watcher(args: argparse.Namespace, config: ConsulConfig) -> None:
    """Start the job's watcher for this command line unless it runs (or this is no job's call)."""
    if args.cache == "off" or args.cache_file or sys.stdout.isatty():
        return  # off, an operator's cache, or a person at a terminal: no background process
    argv = raw_argv(args)
    job = jobdir.job_process()
    if job is None or (args.cache == "auto" and not jobdir.is_horovodrun(job[0])):
        return
    where = fast.job_cache_path(argv, create=True)
    if where is None:
        return
    from hvd_elastic.discovery import watch

    try:
        watch.ensure_running(where[0], where[1], job, argv, config.token)
    except OSError as exc:  # the direct answer stands; the next call tries again
        print(f"discover: cannot start the host cache watcher: {exc}", file=sys.stderr)


def run_watch(args: argparse.Namespace) -> int:
    """``--watch``: keep ``--cache-file`` fresh until stopped."""
    import logging

    from hvd_elastic.discovery import watch

    if not args.cache_file:
        print("discover: --watch needs --cache-file PATH (the file to keep fresh)", file=sys.stderr)
        return 2
    directory = os.path.dirname(os.path.abspath(args.cache_file))
    if not os.path.isdir(directory):
        print(f"discover: --cache-file {args.cache_file!r}: directory {directory!r} does not exist", file=sys.stderr)
        return 2
    try:
        config = consul_config(args)
        options = options_from_args(args)
    except ConfigError as exc:
        return explain_failure("discover", args.service, exc)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    key = args.cache_key or fingerprint(args, config, options)
    # A job's own cache is private; an operator's is readable by the users whose jobs read it.
    mode = 0o600 if args.job else 0o644
    return watch.run(args.cache_file, key, watch_fetch(args, config, options), FAILURES, job=args.job,
                     max_age=cache_max_age(args), mode=mode)


def run(args: argparse.Namespace, cache_tried: bool = False) -> int:
    if args.watch:
        return run_watch(args)
    if args.cache != "off" and not args.cache_file and not cache_tried:
        rec = fast.cached_answer(raw_argv(args))
        if rec is not None:
            return fast.emit(rec)
    try:
        config = consul_config(args)
        options = options_from_args(args)
    except ConfigError as exc:
        return explain_failure("discover", args.service, exc)
    if args.cache != "off" and args.cache_file:
        rec = operator_cache(args, config, options)
        if rec is not None:
            return fast.emit(rec)
    try:
        found, decisions = discover(args, config, options)
    except FAILURES as exc:
        code = explain_failure("discover", args.service, exc)
        if code == 1:
            start_job_watcher(args, config)
        return code
    warn_dropped(decisions)
    # One write of the complete list: a reader never sees a partial one.
    sys.stdout.write(hostlib.format_hosts(found))
    sys.stdout.flush()
    start_job_watcher(args, config)
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


def main(argv: list[str] | None = None, cache_tried: bool = False) -> int:
    """Entry point of ``discovery/consul_hosts`` (no subcommand word), after :func:`.fast.main`."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="consul_hosts",
        description="Print healthy Consul hosts as host:slots lines for horovodrun --host-discovery-script.",
        formatter_class=_HelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(raw_argv=argv)
    args = parser.parse_args(argv)
    return run(args, cache_tried=cache_tried)
