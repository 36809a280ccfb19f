"""``hvd-elastic discover`` and ``discovery/consul_hosts``: healthy hosts for horovodrun.

Prints one ``host:slots`` line per healthy node of the training service, from
``GET /v1/health/service/:name?passing``, for ``horovodrun
--host-discovery-script``.

Exit status and output (what horovodrun relies on):

* 0: stdout holds the complete host list (possibly empty) and nothing else;
  an empty list because the service or a tag asked for exists nowhere in
  Consul gets one ``warning:`` line on stderr naming what exists.
* 1: Consul was unreachable, refused access, failed or answered garbage; one
  line on stderr says why and stdout stays EMPTY (never a partial list).
  horovodrun then keeps its previous host set (or, on the first call of a job,
  stops the job).
* 2: bad flags or environment, or a ``--filter`` Consul refuses.

Invalid entries (a host name that is no RFC 1123 name or IPv4 address, a slot
count that is no positive integer or exceeds ``--max-slots-per-host``) are
dropped with a warning on stderr.

Host cache (``--cache auto``, the default; flags and watchers in
:mod:`._discovery`): a call answers from the job's cache file when it is fresh
(:mod:`.fast`, before any flag is parsed; :mod:`.cachekey`, :mod:`.cache`); otherwise it
queries Consul directly as below and, when horovodrun runs it (``--cache on``:
any parent process) and stdout is no terminal, starts the job's watcher
(:mod:`.watch`), whose single blocking query keeps the file fresh until
horovodrun exits.  ``--cache-file PATH`` reads an operator's
cache (``--watch --cache-file PATH`` keeps one fresh) instead.  A cache the
watcher cannot vouch for is never printed: the call falls back to the direct
query.

Time: every direct call ends within ``--timeout`` seconds (default 0.8;
horovodrun calls it every second under a lock), except a job's first call,
which may take up to ``--first-call-retry`` seconds, for one slow answer or
retrying while Consul is unreachable or has no leader yet (see
:mod:`hvd_elastic.discovery.firstcall`).
"""

from __future__ import annotations

import argparse
import sys

from hvd_elastic.consul.config import ConsulConfig
from hvd_elastic.commands import _discovery
from hvd_elastic.discovery import cachekey, fast, token_guard
from hvd_elastic.health import hosts as hostlib
from hvd_elastic.discovery.firstcall import FirstCall
from hvd_elastic.health.variables import (
    DEFAULT_SLOTS,
    FAILURES,
    FILTER,
    FIRST_CALL_RETRY,
    HOST_NAME,
    MAX_SLOTS,
    MAX_STALE,
    NAMINGS,
    SLOTS_KEY,
    STALE,
    TIMEOUT,
    Variable,
    Settings,
)
from hvd_elastic.options import (
    ConfigError,
    add_consul_arguments,
    add_service_argument,
    argparse_type,
    command_name,
    consul_config,
    env,
    one_line_errors,
)

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs time on this path
if TYPE_CHECKING:
    from hvd_elastic.health.query import HealthQuery

def _default(variable: Variable) -> dict:
    """A flag's ``default=`` and ``type=`` from its variable's row of :mod:`.variables`."""
    return {"default": env(variable.name, variable.default), "type": argparse_type(variable.check)}


def add_arguments(parser: argparse.ArgumentParser, cache: bool = True) -> None:
    """Discovery's flags on ``parser``; the host cache's too unless ``cache`` is false (``status``)."""
    one_line_errors(parser)
    add_service_argument(parser)
    parser.add_argument("--tag", action="append", dest="tags", default=None,
                        help="only instances carrying this tag; repeat for several, all must match (env "
                             "HVD_ELASTIC_TAGS, comma-separated)")
    parser.add_argument("--filter", **_default(FILTER),
                        help="Consul filter expression, e.g. 'Service.Meta.gpu_model == \"H100\"' (env "
                             "HVD_ELASTIC_FILTER)")
    parser.add_argument("--slots-key", **_default(SLOTS_KEY),
                        help="Service.Meta key holding the slot count (env HVD_ELASTIC_SLOTS_KEY; default %(default)s)")
    parser.add_argument("--default-slots", **_default(DEFAULT_SLOTS),
                        help="slots for instances without that Meta key (env HVD_ELASTIC_DEFAULT_SLOTS; default: such "
                             "instances are dropped with a warning)")
    parser.add_argument("--max-slots-per-host", **_default(MAX_SLOTS),
                        help="largest valid slot count; an instance advertising more is dropped with a warning (env "
                             "HVD_ELASTIC_MAX_SLOTS_PER_HOST; default %(default)s)")
    parser.add_argument("--host-name", **_default(HOST_NAME), metavar="{" + ",".join(NAMINGS) + "}",
                        help="what names a host: the Consul node name, the service address (else the node address) or "
                             "the node address (env HVD_ELASTIC_HOST_NAME; default %(default)s)")
    parser.add_argument("--exclude", action="append", default=None, metavar="HOST",
                        help="never print this host; repeat for several (env HVD_ELASTIC_EXCLUDE, comma-separated)")
    parser.add_argument("--timeout", **_default(TIMEOUT),
                        help="total seconds one call may take (env HVD_ELASTIC_DISCOVERY_TIMEOUT; default %(default)s)")
    parser.add_argument("--first-call-retry", **_default(FIRST_CALL_RETRY), metavar="SECONDS",
                        help="how long a job's first call keeps retrying an unreachable or leaderless Consul; 0 "
                             "disables (env HVD_ELASTIC_DISCOVERY_FIRST_CALL_RETRY; default %(default)s)")
    parser.add_argument("--stale", **_default(STALE), nargs="?", const=True,
                        help="let any Consul server answer (?stale), spreading the load off the leader; a follower's "
                             "answer may lack the newest changes for a moment, and answers staler than --max-stale "
                             "fail (env HVD_ELASTIC_STALE; default %(default)s)")
    parser.add_argument("--max-stale", **_default(MAX_STALE), metavar="SECONDS",
                        help="with --stale, the largest X-Consul-LastContact accepted (env HVD_ELASTIC_MAX_STALE; "
                             "default %(default)s)")
    add_consul_arguments(parser)
    if cache:
        _discovery.add_cache_arguments(parser)


def discover(config: ConsulConfig, query: HealthQuery, options: hostlib.Options, *, timeout: float,
             first_call_retry: float) -> tuple[list[tuple[str, int]], list[hostlib.Decision]]:
    """(host lines, every decision): ask Consul and decide.  Raises ConsulError, MalformedResponse or ConfigError.

    A job's first call may keep retrying for ``first_call_retry`` seconds; a later one takes at most ``timeout``.
    """
    from hvd_elastic.health.query import read_health

    first_call = FirstCall(query.service)
    retry_window = first_call_retry if first_call.is_first else 0.0
    # The first call may take the whole window anyway: one slow answer (a large
    # service, a loaded Consul) must not fail every attempt at --timeout.
    entries = read_health(config, query, passing=True, retry_window=retry_window, timeout=max(timeout, retry_window))[0]
    decisions = hostlib.evaluate(entries, options)
    first_call.record_success()
    return hostlib.merge(decisions), decisions


def warn_dropped(decisions: list[hostlib.Decision]) -> None:
    """Log one warning per instance dropped for invalid data (host name or slots)."""
    warnings = hostlib.drop_warnings(decisions)
    if warnings:
        import logging  # only when needed: this path runs every second under horovodrun

        log = logging.getLogger("hvd_elastic.discovery")
        for line in warnings:
            log.warning("%s", line)


def warn_if_nothing_matches(args: argparse.Namespace, config: ConsulConfig, query: HealthQuery) -> None:
    """One stderr line when the service or a tag asked for exists nowhere in Consul (the output stays empty)."""
    from hvd_elastic.health.query import why_empty

    why = why_empty(config, query, args.timeout)
    if why is not None:
        print(f"{command_name(args)}: warning: {why}; no host to print", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Discovery once its flags are parsed; the command's top found no fresh job cache (:func:`.fast.answer`)."""
    if args.watch:
        return _discovery.run_watch(args)
    try:
        token_guard.check_discovery(token_flag=bool(args.token))  # before the token is used anywhere
        config = consul_config(args)
        settings = Settings.from_args(args)
        options = settings.options()
    except ConfigError as exc:
        return _discovery.explain_failure(args, exc)
    if args.cache != "off" and args.cache_file:
        rec = _discovery.operator_cache(args, config, options)
        if rec is not None:
            return fast.emit(rec)
    query = settings.health_query()
    try:
        found, decisions = discover(config, query, options, timeout=args.timeout,
                                    first_call_retry=args.first_call_retry)
    except FAILURES as exc:
        code = _discovery.explain_failure(args, exc)
        if code == 1:
            _discovery.start_job_watcher(args, config, watcher_command())
        return code
    warn_dropped(decisions)
    if not decisions:
        warn_if_nothing_matches(args, config, query)
    if args.cache != "off" and args.cache_file:
        cachekey.count_answer(args.cache_file, "direct")  # the operator's cache could not answer this call
    # One write of the complete list: a reader never sees a partial one.
    sys.stdout.write(hostlib.format_hosts(found))
    sys.stdout.flush()
    _discovery.start_job_watcher(args, config, watcher_command())
    return 0


def watcher_command() -> list[str]:
    """How a job's watcher process starts (:func:`.watch.ensure_running` appends its flags): this module's
    :func:`main` in this interpreter, isolated (``-I -S``, as ``discovery/consul_hosts``), importing this very
    copy of the package."""
    import os

    import hvd_elastic

    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(hvd_elastic.__file__)))
    boot = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
            "from hvd_elastic.commands.discover import main; sys.exit(main(sys.argv[1:]))")
    return [sys.executable, "-I", "-S", "-c", boot, package_parent]


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter without its ``import shutil`` (and bz2, lzma) on every run."""

    def __init__(self, prog: str, **kwargs):
        if kwargs.get("width") is None:
            import os

            text = os.environ.get("COLUMNS", "")
            if text.isdigit():
                columns = int(text)
            else:
                try:
                    columns = os.get_terminal_size(sys.stdout.fileno()).columns
                except OSError:
                    columns = 80
            kwargs["width"] = max(columns - 2, 40)
        super().__init__(prog, **kwargs)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``discovery/consul_hosts`` (no subcommand word), after :func:`.fast.answer` found no answer."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="consul_hosts",
        description="Print healthy Consul hosts as host:slots lines for horovodrun --host-discovery-script.",
        formatter_class=_HelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(raw_argv=argv, _prog=parser.prog)
    args = parser.parse_args(argv)
    return run(args)
