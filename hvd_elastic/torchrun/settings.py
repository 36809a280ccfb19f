"""The Consul rendezvous's settings: torchrun's rendezvous parameters read once, bad values refused.

Contract:

* ``--rdzv-endpoint`` is the Consul agent (``host:port`` or ``http[s]://host:port``); empty means
  ``CONSUL_HTTP_ADDR``, else ``127.0.0.1:8500``.  Token, TLS and datacenter come from the ``CONSUL_HTTP_*``
  variables, as for every hvd-elastic command (the token never from the command line).
* ``--rdzv-id`` names the run: letters, digits, ``.``, ``_``, ``-``, at most 128.  torchrun's default
  ``none`` is refused: two jobs that forgot it would share one rendezvous.
* ``--rdzv-conf``: torch's own keys (``join_timeout``, ``last_call_timeout``, ``close_timeout``,
  ``heartbeat_timeout``, ``keep_alive_interval``, ``keep_alive_max_attempt``) go to torch; ours are
  ``key_prefix`` (default ``hvd-elastic/torchrun``), ``read_timeout`` (seconds one Consul call may take,
  retries included, default 60, as torch's c10d and etcd backends), and the health gate's: ``health_gate``
  (``auto``: a node whose node agent registered ``service`` joins only while it passes and leaves when it
  does not; ``true``: a node without one waits for it; ``false``: off), ``service`` (default
  ``HVD_ELASTIC_SERVICE``, else ``horovod``) and ``leave_grace`` (seconds a leaving node gives the others
  to stop before it stops its own workers, default 2).

Raises :class:`RendezvousSettingsError` (one line naming the value and what was expected).
"""

from __future__ import annotations

import dataclasses
import os
import re

from hvd_elastic.consul.config import ConsulConfig
from hvd_elastic.envvars import DEFAULT_SERVICE, SERVICE_ENV, ConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from torch.distributed.elastic.rendezvous import RendezvousParameters

DEFAULT_KEY_PREFIX = "hvd-elastic/torchrun"
DEFAULT_READ_TIMEOUT_S = 60
DEFAULT_LEAVE_GRACE_S = 2
HEALTH_GATES = ("auto", "true", "false")
_RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
_KEY_PREFIX = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")


class RendezvousSettingsError(ConfigError):
    """A rendezvous parameter of ``torchrun --rdzv-backend consul`` is invalid."""


@dataclasses.dataclass(frozen=True)
class RendezvousSettings:
    consul: ConsulConfig
    run_id: str
    key_prefix: str = DEFAULT_KEY_PREFIX
    read_timeout: int = DEFAULT_READ_TIMEOUT_S
    health_gate: str = "auto"
    service: str = DEFAULT_SERVICE
    leave_grace: int = DEFAULT_LEAVE_GRACE_S

    @property
    def run_prefix(self) -> str:
        """Every key of this run lies under it: the state, and the store's keys."""
        return f"{self.key_prefix}/{self.run_id}"

    @classmethod
    def from_parameters(cls, params: RendezvousParameters) -> RendezvousSettings:
        run_id = params.run_id
        if run_id == "none":
            raise RendezvousSettingsError("--rdzv-id is torchrun's default 'none': give each job its own id "
                                          "(two jobs with the same id share one rendezvous)")
        if not _RUN_ID.fullmatch(run_id):
            raise RendezvousSettingsError(f"--rdzv-id={run_id!r} is not a run id (expected 1-128 letters, digits, "
                                          "'.', '_' or '-')")
        prefix = str(params.get("key_prefix", DEFAULT_KEY_PREFIX)).strip("/")
        if not _KEY_PREFIX.fullmatch(prefix):
            raise RendezvousSettingsError(f"--rdzv-conf key_prefix={prefix!r} is not a Consul key prefix (expected "
                                          "segments of letters, digits, '.', '_' or '-' joined by '/')")
        gate = str(params.get("health_gate", "auto")).lower()
        if gate not in HEALTH_GATES:
            raise RendezvousSettingsError(f"--rdzv-conf health_gate={gate!r} is not one of {', '.join(HEALTH_GATES)}")
        service = str(params.get("service", os.environ.get(SERVICE_ENV) or DEFAULT_SERVICE))
        try:
            consul = ConsulConfig.from_env(addr=params.endpoint or None, addr_flag="--rdzv-endpoint")
        except ConfigError as exc:
            raise RendezvousSettingsError(str(exc)) from None
        return cls(consul, run_id, prefix, whole(params, "read_timeout", DEFAULT_READ_TIMEOUT_S, minimum=1),
                   gate, service, whole(params, "leave_grace", DEFAULT_LEAVE_GRACE_S, minimum=0))


def whole(params: RendezvousParameters, key: str, default: int, *, minimum: int, unit: str = "seconds") -> int:
    """``--rdzv-conf`` ``key``, a whole number of at least ``minimum``."""
    try:
        value = params.get_as_int(key, default)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise RendezvousSettingsError(f"--rdzv-conf {key}={params.get(key)!r} is not a number of {unit} "
                                      f"(expected a whole number of at least {minimum})")
    return value
