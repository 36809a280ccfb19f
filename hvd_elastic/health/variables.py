"""Discovery's settings that variables give: one table for the flags' defaults and for a worker's reading.

``hvd-elastic discover`` takes each of them as a flag whose default is the
variable (:mod:`hvd_elastic.commands.discover`).  A training worker has no discovery command line but
follows the same service's health (:mod:`hvd_elastic.training._internal.health_cut`):
:func:`from_environment` reads the same variables, with the same types, into
the same :class:`Settings` discovery builds from its flags
(:meth:`Settings.from_args`).  No argparse here.
"""

from __future__ import annotations

import dataclasses
import os
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
class Settings:
    """Discovery's settings in one process, typed: from its flags (:meth:`from_args`, whose defaults are the
    variables) or, where there is no discovery command line (a worker), from the variables (:meth:`from_env`)."""

    service: str
    filter: str | None
    slots_key: str
    default_slots: int | None
    max_slots_per_host: int
    host_name: str
    timeout: float  # a plain (non-blocking) read's bound
    first_call_retry: float
    stale: bool
    max_stale: float
    datacenter: str | None
    tags: tuple[str, ...]
    exclude: frozenset[str]  # lower-case host names
    asked: tuple[tuple[str, str], ...]  # (setting, the flag or variable that gave it): service, tags, filter

    @classmethod
    def from_args(cls, args, environ: Mapping[str, str] | None = None) -> Settings:
        """From parsed flags (``args`` needs only the attributes; their variables' fallbacks for tags and
        exclude)."""
        tags = args.tags if args.tags is not None else env_list(TAGS_ENV, environ)
        exclude = args.exclude if args.exclude is not None else env_list(EXCLUDE_ENV, environ)
        asked = (("service", setting(args, "service", "--service")),
                 ("tags", "--tag" if args.tags is not None else TAGS_ENV),
                 ("filter", setting(args, "filter", "--filter")))
        return cls(**{v.dest: getattr(args, v.dest) for v in VARIABLES}, tags=tuple(tags),
                   exclude=frozenset(h.lower() for h in exclude), asked=asked)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """From the variables alone, as ``hvd-elastic discover`` with no flags would have them; messages name
        the variable of each setting, set or not (a worker has no flag to name).  Raises ConfigError naming
        the first bad variable."""
        environ = os.environ if environ is None else environ
        values = {v.dest: v.check.read(v.name, v.default, environ) for v in VARIABLES}
        return cls(**values, tags=tuple(env_list(TAGS_ENV, environ)),
                   exclude=frozenset(h.lower() for h in env_list(EXCLUDE_ENV, environ)),
                   asked=(("service", SERVICE.name), ("tags", TAGS_ENV), ("filter", FILTER.name)))

    def options(self) -> hostlib.Options:
        return hostlib.Options(slots_key=self.slots_key, default_slots=self.default_slots,
                               max_slots_per_host=self.max_slots_per_host, naming=hostlib.HostNaming(self.host_name),
                               exclude=self.exclude, tags=self.tags)

    def health_query(self) -> HealthQuery:
        """The typed health query these settings ask for."""
        from hvd_elastic.health.query import HealthQuery  # socket, json: not on the cached path

        return HealthQuery(service=self.service, tags=self.tags, filter=self.filter, stale=self.stale,
                           max_stale=self.max_stale, settings=dict(self.asked))


@dataclasses.dataclass(frozen=True)
class Discovery:
    """Everything a blocking read of the service's health needs, typed."""

    config: ConsulConfig
    query: HealthQuery
    options: hostlib.Options
    timeout: float  # a plain (non-blocking) read's bound


def from_environment(environ: Mapping[str, str] | None = None) -> Discovery:
    """Discovery's settings from the variables alone, with the Consul configuration (``CONSUL_*``).

    Raises ConfigError naming the first bad variable (and ``CONSUL_*``'s, from :meth:`ConsulConfig.from_env`).
    """
    found = Settings.from_env(environ)
    config = ConsulConfig.from_env(datacenter=found.datacenter)
    return Discovery(config, found.health_query(), found.options(), found.timeout)
