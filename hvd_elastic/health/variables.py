"""Discovery's settings that variables give: one table for the flags' defaults and for a worker's reading.

``hvd-elastic discover`` takes each of them as a flag whose default is the
variable (:mod:`.cli`).  A training worker has no discovery command line but
follows the same service's health (:mod:`hvd_elastic.training._internal.health_cut`):
:func:`from_environment` reads the same variables, with the same types, into
the same typed settings discovery builds from its flags
(:func:`options_from_args`, :func:`health_query`).  No argparse here.
"""

from __future__ import annotations

import dataclasses
import os
import types
from collections.abc import Mapping

from hvd_elastic.consul.config import ConsulConfig
from hvd_elastic.consul.errors import ConsulError
from hvd_elastic.health import hosts as hostlib
from hvd_elastic.envvars import (
    BOOLEAN,
    DATACENTER_ENV,
    DEFAULT_SERVICE,
    NON_NEGATIVE_SECONDS,
    POSITIVE_INT,
    POSITIVE_SECONDS,
    SERVICE_ENV,
    TEXT,
    Check,
    ConfigError,
    env_list,
    setting,
)

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs time on discovery's direct path
if TYPE_CHECKING:
    from hvd_elastic.health.query import HealthQuery

NAMINGS = [n.value for n in hostlib.HostNaming]
HOST_NAMING = Check(lambda text: hostlib.HostNaming(text).value, lambda _: True, f"one of {', '.join(NAMINGS)}")


@dataclasses.dataclass(frozen=True)
class Variable:
    """A discovery setting's variable: its name, its default (as text, parsed like a value) and its type."""

    dest: str  # the flag's argparse destination
    name: str
    default: str | None
    check: Check


SERVICE = Variable("service", SERVICE_ENV, DEFAULT_SERVICE, TEXT)
FILTER = Variable("filter", "HVD_ELASTIC_FILTER", None, TEXT)
SLOTS_KEY = Variable("slots_key", "HVD_ELASTIC_SLOTS_KEY", "slots", TEXT)
DEFAULT_SLOTS = Variable("default_slots", "HVD_ELASTIC_DEFAULT_SLOTS", None, POSITIVE_INT)
MAX_SLOTS = Variable("max_slots_per_host", "HVD_ELASTIC_MAX_SLOTS_PER_HOST", str(hostlib.DEFAULT_MAX_SLOTS),
                     POSITIVE_INT)
HOST_NAME = Variable("host_name", "HVD_ELASTIC_HOST_NAME", hostlib.HostNaming.NODE.value, HOST_NAMING)
TIMEOUT = Variable("timeout", "HVD_ELASTIC_DISCOVERY_TIMEOUT", "0.8", POSITIVE_SECONDS)
FIRST_CALL_RETRY = Variable("first_call_retry", "HVD_ELASTIC_DISCOVERY_FIRST_CALL_RETRY", "10", NON_NEGATIVE_SECONDS)
STALE = Variable("stale", "HVD_ELASTIC_STALE", "false", BOOLEAN)
MAX_STALE = Variable("max_stale", "HVD_ELASTIC_MAX_STALE", "5", POSITIVE_SECONDS)
DATACENTER = Variable("datacenter", DATACENTER_ENV, None, TEXT)
VARIABLES = (SERVICE, FILTER, SLOTS_KEY, DEFAULT_SLOTS, MAX_SLOTS, HOST_NAME, TIMEOUT, FIRST_CALL_RETRY, STALE,
             MAX_STALE, DATACENTER)
TAGS_ENV, EXCLUDE_ENV = "HVD_ELASTIC_TAGS", "HVD_ELASTIC_EXCLUDE"  # comma-separated; --tag and --exclude repeat

#: What reading and using these settings fails with: bad settings (exit 2), Consul, or Consul's garbage (exit 1).
FAILURES = (ConfigError, ConsulError, hostlib.MalformedResponse)


@dataclasses.dataclass(frozen=True)
class Discovery:
    """Everything a blocking read of the service's health needs, typed."""

    config: ConsulConfig
    query: HealthQuery
    options: hostlib.Options
    timeout: float  # a plain (non-blocking) read's bound


def from_environment(environ: Mapping[str, str] | None = None) -> Discovery:
    """Discovery's settings from the variables alone, as ``hvd-elastic discover`` with no flags would have them.

    Raises ConfigError naming the first bad variable (and ``CONSUL_*``'s, from :meth:`ConsulConfig.from_env`).
    """
    environ = os.environ if environ is None else environ
    values = {v.dest: v.check.read(v.name, v.default, environ) for v in VARIABLES}
    # Messages name the variable of each setting, set or not: a worker has no flag to name.
    args = types.SimpleNamespace(**values, tags=None, exclude=None, _env_sources={v.dest: v.name for v in VARIABLES})
    options = options_from_args(args, environ)
    config = ConsulConfig.from_env(datacenter=values["datacenter"])
    return Discovery(config, health_query(args, options), options, values["timeout"])


def options_from_args(args, environ: Mapping[str, str] | None = None) -> hostlib.Options:
    """Discovery options from parsed flags (with their variables' fallbacks); ``args`` needs only attributes."""
    tags = args.tags if args.tags is not None else env_list(TAGS_ENV, environ)
    exclude = args.exclude if args.exclude is not None else env_list(EXCLUDE_ENV, environ)
    return hostlib.Options(
        slots_key=args.slots_key,
        default_slots=args.default_slots,
        max_slots_per_host=args.max_slots_per_host,
        naming=hostlib.HostNaming(args.host_name),
        exclude=frozenset(h.lower() for h in exclude),
        tags=tuple(tags),
    )


def health_query(args, options: hostlib.Options) -> HealthQuery:
    """The typed health query these settings ask for."""
    from hvd_elastic.health.query import HealthQuery  # socket, json: not on the cached path

    return HealthQuery(service=args.service, tags=options.tags, filter=args.filter, stale=args.stale,
                       max_stale=args.max_stale, settings=asked_settings(args))


def asked_settings(args) -> dict[str, str]:
    """The flag or variable that set the service, the tags and the filter, for messages about them."""
    return {"service": setting(args, "service", "--service"),
            "tags": "--tag" if args.tags is not None else TAGS_ENV,
            "filter": setting(args, "filter", "--filter")}
