"""Discovery's typed settings, built from its parsed flags (:func:`.cli.add_arguments`) and the environment.

Everything that reads those settings -- ``hvd-elastic discover`` (:mod:`.cli`),
its watcher (:mod:`.cachecli`), ``hvd-elastic status`` (:mod:`.status`) --
gets them here, and reports a failure to get them or to use them the same way
(:data:`FAILURES`, :func:`explain_failure`).
"""

from __future__ import annotations

from hvd_elastic.consul.errors import ConsulError
from hvd_elastic.discovery import hosts as hostlib
from hvd_elastic.options import ConfigError, command_name, env_list, setting
from hvd_elastic.options import explain_failure as _explain

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs time on discovery's direct path
if TYPE_CHECKING:
    import argparse

    from hvd_elastic.discovery.query import HealthQuery


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


def health_query(args: argparse.Namespace, options: hostlib.Options) -> HealthQuery:
    """The typed health query these flags ask for."""
    from hvd_elastic.discovery.query import HealthQuery  # socket, json: not on the cached path

    return HealthQuery(service=args.service, tags=options.tags, filter=args.filter, stale=args.stale,
                       max_stale=args.max_stale, settings=asked_settings(args))


def asked_settings(args: argparse.Namespace) -> dict[str, str]:
    """The flag or variable that set the service, the tags and the filter, for messages about them."""
    return {"service": setting(args, "service", "--service"),
            "tags": "--tag" if args.tags is not None else "HVD_ELASTIC_TAGS",
            "filter": setting(args, "filter", "--filter")}


FAILURES = (ConfigError, ConsulError, hostlib.MalformedResponse)


def explain_failure(args: argparse.Namespace, exc: Exception) -> int:
    """Print one stderr line for a failure in FAILURES and return the exit code."""
    if isinstance(exc, hostlib.MalformedResponse):
        exc = hostlib.MalformedResponse(f"Consul's answer for service {args.service!r} is malformed: {exc}")
    return _explain(command_name(args), exc)
