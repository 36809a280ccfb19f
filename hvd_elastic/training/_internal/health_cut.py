"""The survivors' side of a lost host: fail the collective that waits on it, now.

A collective with a peer on a host that froze or dropped off the network
waits out ``HOROVOD_GLOO_TIMEOUT_SECONDS`` (real jobs cannot set it low: a long
collective or a slow checkpoint barrier would look like a failure).  Consul
knows much sooner: the host's node agent stops renewing its TTL check.  So the
first rank of every host (``HOROVOD_LOCAL_RANK`` 0: one Consul reader per
host, and any surviving host suffices) follows the training service's health
with the same blocking query as the discovery watcher, and once
:class:`~hvd_elastic.health.lost.LostHostJudge` judges a host of its
current world lost (failed, never drained, for the grace period) it hangs up
its own Gloo connections (:func:`.gloo_hangup.hang_up`).  Its collective fails
at once, every peer it talks to fails in turn (and hangs up on failing, see
:mod:`.elastic_loop`), and the job restores its last commit and re-forms
without the host: horovodrun has recorded that host's workers as failed
because the discovery watcher ended their sessions (:mod:`hvd_elastic.discovery.reaper`).

Never cut for anything else: a slow step, a rank writing a checkpoint or a
drained host are healthy in Consul; an unreachable Consul judges no one; a
rank never judges its own host (the launcher does).

Configuration is discovery's, read from the environment horovodrun copies to
every worker: ``CONSUL_HTTP_ADDR`` (default the node's local agent),
``CONSUL_HTTP_TOKEN_FILE`` and the TLS variables, ``HVD_ELASTIC_SERVICE``,
``HVD_ELASTIC_TAGS``, ``HVD_ELASTIC_FILTER`` and ``HVD_ELASTIC_HOST_NAME`` (set
those rather than discovery flags, so workers name hosts as horovodrun does),
``HVD_ELASTIC_HEALTH_GRACE``.  On unless ``HVD_ELASTIC_HEALTH_CUT=0`` or
``HVD_ELASTIC_GLOO_HANGUP=0`` (a cut is a hang-up); both are the worker's
settings (:mod:`hvd_elastic.training.settings`).

Consul's verdict alone is not enough: a host whose node agent died while its
workers train on is critical too, and cutting it would turn a graceful resize
into a failure and a rollback.  So a rank cuts only while its own world is
stalled: none of its Gloo connections has received data for
:data:`QUIET_S` (:func:`.gloo_hangup.quiet_for`).  Horovod's background loop
negotiates with its peers every cycle, also while the training code computes,
sleeps or writes a checkpoint (measured: at most 4 ms quiet during a 5 s sleep,
250 ms during 3 s of busy matrix products on a loaded 2-core machine), and a
ring that waits on a lost peer has been quiet on every connection since the
fault.  A rank that cannot see its Gloo connections cuts on Consul's verdict.
"""

from __future__ import annotations

import logging
import os
import threading

from hvd_elastic.envvars import ConfigError, horovod_hostname
from hvd_elastic.health import lost
from hvd_elastic.training._internal import gloo_hangup
from hvd_elastic.training.settings import WorkerSettings

log = logging.getLogger(__name__)

# A live world's Gloo connections carry Horovod's negotiation every cycle (milliseconds): a rank that heard
# nothing for this long is waiting on someone.  Well under the TTL that made the host critical, and a
# stalled ring has been quiet since the fault itself, so it costs a real failure nothing.
QUIET_S = 2.0
RETRIES, RETRY_S = 10, 3.0  # hang-ups repeated while this rank has not left the world it cut
WAIT_S = 30.0  # the blocking read's ?wait=: a change returns at once, this bounds an idle read


class HealthCut:
    """One rank's reader of Consul's health and its judge (module docstring)."""

    def __init__(self, my_host: str, grace: float, quiet_for=gloo_hangup.quiet_for):
        self.my_host = my_host
        self.quiet_for = quiet_for  # seconds since this rank's Gloo connections last received data
        self._spared: set[str] = set()  # failed hosts not cut for live traffic, this world (logged once)
        self._world: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        self.cuts: list[str] = []  # hosts this rank hung up for, in order
        self.judge = lost.LostHostJudge(grace, watched=self._watched, on_lost=self._cut)
        self._stop = threading.Event()
        self._left = threading.Event()  # set once this rank has left the world it cut (between_worlds)

    def set_world(self, hosts) -> None:
        """The hosts of the world just formed (every rank's ``HOROVOD_HOSTNAME``)."""
        with self._lock:
            self._world = frozenset(hosts) - {self.my_host}
            self._spared.clear()
            self._left.clear()
        self.judge.forget_acted()

    def between_worlds(self) -> None:
        """No world to cut from until :meth:`set_world` (a reset is under way)."""
        with self._lock:
            self._world = frozenset()
            self._left.set()

    def _watched(self) -> frozenset[str]:
        with self._lock:
            return self._world

    def _cut(self, host: str, why: str) -> bool:
        """Hang up for ``host`` if it is of this world and the world is stalled; False: ask again later."""
        quiet = self.quiet_for()
        with self._lock:
            if host not in self._world:
                return True
            if quiet is not None and quiet < QUIET_S:
                if host not in self._spared:
                    self._spared.add(host)
                    log.warning("host %s of this world failed its health checks in Consul (%s), but this rank "
                                "heard from its peers %.1f s ago: not cutting while Gloo traffic flows",
                                host, why or "critical", quiet)
                return False
            self._world = frozenset()  # one cut per world: the next world is set after the reset
        self.cuts.append(host)
        done = gloo_hangup.hang_up(f"for lost host {host}")
        log.warning("host %s of this world failed its health checks in Consul (%s): hung up this rank's %d Gloo "
                    "connections so the job restores its last commit and re-forms without it",
                    host, why or "critical", len(done))
        # Until this rank has left the world, hang up again: a connection Gloo had not yet registered
        # in its loop when it was listed is found on a later listing.
        for attempt in range(1, RETRIES + 1):
            if self._left.wait(RETRY_S) or self._stop.is_set():
                return True
            done = gloo_hangup.hang_up(f"for lost host {host}, again")
            log.warning("still in the world %.0f s after cutting host %s loose: hung up %d Gloo connections again",
                        attempt * RETRY_S, host, len(done))
        return True

    def start(self, fetch, failures) -> None:
        from hvd_elastic.health.watch import follow

        threading.Thread(target=follow, args=(fetch, self.judge, self._stop, failures), name="health-cut-read",
                         daemon=True).start()
        threading.Thread(target=self.judge.run, args=(self._stop,), name="health-cut", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()


def start(settings: WorkerSettings) -> HealthCut | None:
    """This rank's HealthCut, running; None when it is off, or not this rank's job (not local rank 0).

    A bad discovery setting is one warning and no cut: a health watch is never
    a reason to stop training.
    """
    if not (settings.health_cut and settings.gloo_hangup) or os.environ.get("HOROVOD_LOCAL_RANK", "0") != "0":
        return None
    try:
        fetch, failures = _fetch()
    except ConfigError as exc:
        log.warning("health cut off: %s", exc)
        return None
    cut = HealthCut(horovod_hostname(), settings.health_grace)
    cut.start(fetch, failures)
    return cut


def _fetch():
    """Discovery's blocking health read, configured from the environment as discovery's flags default."""
    from hvd_elastic.health import variables, watch

    found = variables.from_environment()
    return watch.watch_fetch(found.config, found.query, found.options, WAIT_S, found.timeout), variables.FAILURES
