"""The Consul rendezvous's settings: torchrun's rendezvous parameters read once, bad values refused.

Contract:

* ``--rdzv-endpoint`` is the Consul agent (``host:port`` or ``http[s]://host:port``); empty means
  ``CONSUL_HTTP_ADDR``, else ``127.0.0.1:8500``.  Token, TLS and datacenter come from the ``CONSUL_HTTP_*``
  variables, as for every hvd-elastic command (the token never from the command line).
* ``--rdzv-id`` names the run: letters, digits, ``.``, ``_``, ``-``, at most 128.  torchrun's default
  ``none`` is refused: two jobs that forgot it would share one rendezvous.
* ``--rdzv-conf``: torch's own keys (``join_timeout``, ``last_call_timeout``, ``close_timeout``,
  ``heartbeat_timeout``, ``keep_alive_interval``, ``keep_alive_max_attempt``) go to torch; ours are
  ``key_prefix`` (default ``hvd-elastic/torchrun``) and ``read_timeout`` (seconds one Consul call may take,
  retries included, default 60, as torch's c10d and etcd backends).

Raises :class:`RendezvousSettingsError` (one line naming the value and what was expected).
"""

from __future__ import annotations

import dataclasses
import re

from hvd_elastic.consul.config import ConsulConfig
from hvd_elastic.envvars import ConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from torch.distributed.elastic.rendezvous import RendezvousParameters

DEFAULT_KEY_PREFIX = "hvd-elastic/torchrun"
DEFAULT_READ_TIMEOUT_S = 60
_RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
_KEY_PREFIX = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")


class RendezvousSettingsError(ConfigError):
    """A rendezvous parameter of ``torchrun --rdzv-backend consul`` is invalid."""


@dataclasses.dataclass(frozen=True)
class RendezvousSettings:
    consul: ConsulConfig
    run_id: str
    key_prefix: str = DEFAULT_KEY_PREFIX
    read_timeout: float = DEFAULT_READ_TIMEOUT_S

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
        try:
            read_timeout = params.get_as_int("read_timeout", DEFAULT_READ_TIMEOUT_S)
        except ValueError:
            read_timeout = None
        if read_timeout is None or read_timeout <= 0:
            raise RendezvousSettingsError(f"--rdzv-conf read_timeout={params.get('read_timeout')!r} is not a "
                                          "number of seconds (expected a whole number above 0)")
        try:
            consul = ConsulConfig.from_env(addr=params.endpoint or None, addr_flag="--rdzv-endpoint")
        except ConfigError as exc:
            raise RendezvousSettingsError(str(exc)) from None
        return cls(consul, run_id, prefix, float(read_timeout))
