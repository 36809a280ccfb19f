"""What ``hvd-elastic discover`` and ``status`` share: the host cache's flags and watchers, and failures.

:mod:`.discover` calls in here; the file format is
:mod:`hvd_elastic.discovery.cache`, its key and neighbouring files
:mod:`hvd_elastic.discovery.cachekey`, the blocking-query loop
:mod:`hvd_elastic.discovery.watch`.

* :func:`start_job_watcher` -- after a direct query, start the job's watcher
  for this command line (only under horovodrun with ``--cache auto``, never
  for a terminal).
* :func:`operator_cache` -- an operator's ``--cache-file``, printed only when
  fresh and written for the same settings (:func:`fingerprint`).
* :func:`run_watch` -- ``--watch``: the watcher process itself.
* :func:`explain_failure` -- one stderr line and the exit code for a failure to
  get or use discovery's settings (:data:`hvd_elastic.health.variables.FAILURES`).
"""

from __future__ import annotations

import argparse
import os
import sys

from hvd_elastic.consul.config import ConsulConfig
from hvd_elastic.discovery import cache, cachekey, jobdir
from hvd_elastic.health import hosts as hostlib
from hvd_elastic.health.variables import FAILURES, Settings
from hvd_elastic.options import (
    ConfigError,
    argument_type,
    command_name,
    consul_config,
    env,
    fail,
    explain_failure as options_explain,
    positive_seconds,
    setting,
)

cache_mode = argument_type(lambda text: text if text in ("auto", "on", "off") else None, lambda _: True,
                           "one of auto, on, off")
job_type = argument_type(lambda text: tuple(text.split("-", 1)) if text.split("-", 1)[0].isdigit() else None,
                         lambda v: len(v) == 2, "PID-START")


def add_cache_arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Add the host cache's flags to ``parser``; returns their actions."""
    group = parser.add_argument_group("host cache (see discovery/README.md)")
    return [
        group.add_argument("--cache", type=cache_mode, metavar="{auto,on,off}",
                           default=env("HVD_ELASTIC_DISCOVERY_CACHE", "auto"),
                           help="auto: answer from a fresh cache, starting the job's watcher on its first call when "
                                "horovodrun runs this; on: also under any other parent process (tests, other "
                                "launchers); off: always query Consul (env HVD_ELASTIC_DISCOVERY_CACHE; default "
                                "%(default)s)"),
        group.add_argument("--cache-file", metavar="PATH", default=env("HVD_ELASTIC_DISCOVERY_CACHE_FILE"),
                           help="read the cache an operator's `discover --watch --cache-file PATH` keeps fresh (env "
                                "HVD_ELASTIC_DISCOVERY_CACHE_FILE)"),
        group.add_argument("--watch", action="store_true",
                           help="keep --cache-file fresh with one blocking query until stopped (SIGTERM)"),
        group.add_argument("--watch-wait", type=positive_seconds, default=env("HVD_ELASTIC_DISCOVERY_WATCH_WAIT", "60"),
                           metavar="SECONDS",
                           help="the blocking query's ?wait= (env HVD_ELASTIC_DISCOVERY_WATCH_WAIT; default "
                                "%(default)s)"),
        group.add_argument("--metrics-addr", metavar="[HOST]:PORT", default=env("HVD_ELASTIC_DISCOVERY_METRICS_ADDR"),
                           help="with --watch: serve the watcher's Prometheus metrics at http://HOST:PORT/metrics (a "
                                "bare port binds 127.0.0.1; env HVD_ELASTIC_DISCOVERY_METRICS_ADDR; default off)"),
        group.add_argument("--cache-max-age", type=positive_seconds, default=env("HVD_ELASTIC_DISCOVERY_CACHE_MAX_AGE"),
                           metavar="SECONDS",
                           help="freshness bound: a cache whose last Consul answer is older is not used (env "
                                "HVD_ELASTIC_DISCOVERY_CACHE_MAX_AGE; default the wait plus its 1/16 jitter plus 5 s)"),
        # Set by ensure_running for the job's own watcher, never by hand.
        group.add_argument("--cache-key", help=argparse.SUPPRESS),
        group.add_argument("--job", type=job_type, help=argparse.SUPPRESS),
    ]


def cache_flags() -> list[str]:
    """Every option string of the host cache's flags (for a command that must refuse them)."""
    scratch = argparse.ArgumentParser(add_help=False)
    return [flag for action in add_cache_arguments(scratch) for flag in action.option_strings]


def cache_max_age(args: argparse.Namespace) -> float:
    """The freshness bound: explicit, or a few seconds beyond the longest a blocking query may park."""
    return args.cache_max_age or args.watch_wait * 17 / 16 + 5.0


def fingerprint(args: argparse.Namespace, config: ConsulConfig, options: hostlib.Options) -> str:
    """What an operator's cache must have been written for: every setting that shapes the output."""
    settings = (config.base_url, config.datacenter, args.service, options.tags, args.filter, args.stale,
                args.max_stale if args.stale else None, options.slots_key, options.default_slots,
                options.max_slots_per_host, options.naming.value, sorted(options.exclude))
    return "settings-" + cache.sha256_hex(repr(settings).encode())


def raw_argv(args: argparse.Namespace) -> list[str]:
    """The discovery arguments as given, which key the job's cache (see :mod:`.cachekey`)."""
    if getattr(args, "raw_argv", None) is not None:
        return args.raw_argv
    argv = sys.argv[1:]  # hvd-elastic [global options] discover ARGS
    return argv[argv.index("discover") + 1:] if "discover" in argv else argv


def operator_cache(args: argparse.Namespace, config: ConsulConfig, options: hostlib.Options) -> cache.Record | None:
    """The operator's cache (--cache-file) when it is fresh and written for these settings.

    A job's later calls then find it without parsing flags: an alias in the
    job directory names the file and the fingerprint it must carry.
    """
    settings = fingerprint(args, config, options)
    try:
        rec = cache.load(args.cache_file, settings, (os.getuid(), 0))
    except cache.CacheInvalid as exc:
        print(f"{command_name(args)}: warning: ignoring the host cache {args.cache_file}: {exc}", file=sys.stderr)
        return None
    if rec is None or cache.untrusted_reason(rec) is not None:
        return None
    cachekey.count_answer(args.cache_file, "cache")
    where = cachekey.job_cache_path(raw_argv(args), create=True)
    if where is not None and not sys.stdout.isatty():
        try:
            cachekey.write_alias(where[0] + ".alias", args.cache_file, settings)
        except OSError:
            pass  # later calls parse their flags again, nothing worse
    return rec


def start_job_watcher(args: argparse.Namespace, config: ConsulConfig, command: list[str]) -> None:
    """Start the job's watcher for this command line unless it runs (or this is no job's call).

    ``command`` runs discovery's command line with the arguments that follow
    (:func:`.discover.watcher_command`).
    """
    if args.cache == "off" or args.cache_file or sys.stdout.isatty():
        return  # off, an operator's cache, or a person at a terminal: no background process
    argv = raw_argv(args)
    job = jobdir.job_process()
    if job is None or (args.cache == "auto" and not jobdir.is_horovodrun(job[0])):
        return
    where = cachekey.job_cache_path(argv, create=True)
    if where is None:
        return
    from hvd_elastic.discovery import watch

    try:
        watch.ensure_running(where[0], where[1], job, argv, config, command)
    except OSError as exc:  # the direct answer stands; the next call tries again
        print(f"{command_name(args)}: warning: cannot start the host cache watcher: {exc}", file=sys.stderr)


def run_watch(args: argparse.Namespace) -> int:
    """``--watch``: keep ``--cache-file`` fresh until stopped."""
    import logging

    from hvd_elastic.discovery import watch
    from hvd_elastic.health.watch import watch_fetch

    prog = command_name(args)
    if not args.cache_file:
        return fail(prog, "--watch needs --cache-file PATH (the file to keep fresh)", 2)
    directory = os.path.dirname(os.path.abspath(args.cache_file))
    if not os.path.isdir(directory):
        return fail(prog, f"{setting(args, 'cache_file', '--cache-file')}={args.cache_file!r}: directory "
                          f"{directory!r} does not exist", 2)
    try:
        config = consul_config(args)
        settings = Settings.from_args(args)
        options = settings.options()
        reap_grace = _reap_grace() if args.job else None
    except ConfigError as exc:
        return explain_failure(args, exc)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                            stream=sys.stderr)
    key = args.cache_key or fingerprint(args, config, options)
    # A job's own cache is private; an operator's is readable by the users whose jobs read it.
    mode = 0o600 if args.job else 0o644
    fetch = watch_fetch(config, settings.health_query(), options, args.watch_wait, args.timeout)
    fetch = _say_why_unanswered(fetch, logging.getLogger("hvd_elastic.discovery.watch"))
    return watch.run(args.cache_file, key, fetch, FAILURES, job=args.job,
                     max_age=cache_max_age(args), mode=mode, reap_grace=reap_grace, metrics_addr=args.metrics_addr)


def _say_why_unanswered(fetch, log):
    """``fetch``, logging each new failure until Consul first answers.

    The watcher's publisher reports a failure only after an answer (a change
    from answering to failing); a watcher started while Consul is unreachable
    would otherwise say nothing at all about why its cache stays empty.
    """
    answered, said = False, None

    def logged(index: int):
        nonlocal answered, said
        try:
            result = fetch(index)
        except FAILURES as exc:
            if not answered and str(exc) != said:
                log.warning("no answer from Consul yet: %s; retrying", exc)
                said = str(exc)
            raise
        answered = True
        return result

    return logged


def _reap_grace() -> float | None:
    """The reaper's grace for a job's watcher, None when ``HVD_ELASTIC_HEALTH_REAP`` turns it off."""
    from hvd_elastic.discovery import reaper
    from hvd_elastic.health import lost

    return lost.grace_from_env() if reaper.enabled() else None


def explain_failure(args: argparse.Namespace, exc: Exception) -> int:
    """Print one stderr line for a failure in :data:`hvd_elastic.health.variables.FAILURES`; return the exit code."""
    if isinstance(exc, hostlib.MalformedResponse):
        exc = hostlib.MalformedResponse(f"Consul's answer for service {args.service!r} is malformed: {exc}")
    return options_explain(command_name(args), exc)
