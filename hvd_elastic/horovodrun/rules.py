"""hvd-elastic's rules inside horovodrun's elastic driver, for jobs that find their hosts through hvd-elastic.

Horovod's driver (``horovod/runner/elastic/driver.py``, ``registration.py``,
``gloo_run.py``) was written for a fixed pool of machines; under churn its
rules end or wedge the job.  For a job whose ``--host-discovery-script`` is
hvd-elastic's (``consul_hosts``, ``hvd-elastic discover``), or any job run
with ``HVD_ELASTIC_DRIVER=1``, nine of them change (``HVD_ELASTIC_DRIVER=0``
keeps Horovod's):

1. **A failed host comes back.**  Without ``--blacklist-cooldown-range`` Horovod
   excludes a host whose worker failed for the rest of the job, so a cluster
   that loses a worker now and then runs out of hosts.  The default range
   becomes :data:`COOLDOWN`: a failed host returns once discovery lists it
   again (Consul calls it healthy) and its cooldown has passed, 4-6 s after
   its first failure, doubling with each later one that comes within
   :data:`DECAY_S` of the one before, up to 60 s: a flapping host is held
   off longer and longer instead of resetting the job in a loop, and a host
   that fails now and then starts again from 4-6 s.  An explicit
   ``--blacklist-cooldown-range`` is kept as given (Horovod's count, which
   never decays).
2. **A round in which every worker failed restarts from the checkpoint.**
   Horovod ends the job then ("failure count == N -> stop running",
   horovod/horovod#3264): a host lost while the others are in ``hvd.init()``
   makes every one of them fail.  So it does when every host of the round had
   a worker fail ("blacklisted slots count == N": a crash in a world on one
   host), though under rule 1 each comes back.  When a worker has announced a durable
   checkpoint (``@hvd_elastic.run`` does, see :data:`RESUMABLE_PATH`), the
   driver starts a new world on the hosts discovery lists and it resumes from
   that checkpoint; so does a job none of whose workers ever got through
   ``hvd.init()`` (nothing trained: a host lost during the job's first
   rendezvous); at most :data:`ALL_FAILED_ROUNDS` such rounds in a row
   (a round in which any worker got through resets the count).  Horovod's rule
   stands when workers trained and none announced a checkpoint (the state would be lost), when
   every worker exited 1 (an exception in the training code: it would only fail
   again), and past that count.
3. **A worker that ends after the driver stopped never waits at its barrier.**
   Horovod records it and waits for a round that will never fill; the
   launcher, joining that thread, then stays alive with no worker left.
4. **horovodrun ends.**  On SIGTERM or SIGINT it stops the driver as well as
   the workers, and exits ``128 + signal`` once its children are gone (at most
   :data:`STOP_GRACE_S`, then they are SIGKILLed); and once the driver stopped
   for any reason, a process still alive :data:`STOP_GRACE_S` later prints
   every thread's stack and exits 1, so it never outlives its job.
5. **A world that lost a worker before it formed is given up at once.**  Gloo's
   rendezvous inside ``hvd.init()`` waits ``HOROVOD_GLOO_TIMEOUT_SECONDS`` for
   every rank and then aborts the process, so in Horovod a host lost while the
   others re-initialise costs that whole timeout and every survivor's state.
   Once a worker of the current world exits with a failure (a crash, or
   discovery's reaper ending the session of a host Consul judged lost), the
   driver marks the world doomed in its store (:data:`WORLD_PATH`): survivors
   waiting to enter ``hvd.init()`` ask for their place in the next world
   instead and keep their state (:mod:`hvd_elastic.training._internal.rendezvous`),
   and a request of Gloo's own rendezvous for that world is answered 503, so a
   process already inside it fails in about 1.5 s (Horovod's client retries
   three times) instead of waiting out the timeout; its host is not
   blacklisted for that failure (rule 1 would hold a healthy host out).  The
   store is cleared when the next world starts.
6. **A failed worker's slot gets a new worker.**  Horovod starts workers only for
   slots that were not in the previous world: it takes every slot that was as
   still running.  A host whose worker failed is normally blacklisted and left out
   of the next world, but one that is back by the time the world is made (its
   cooldown ended while the driver waited for ``--min-np`` hosts, or rule 5 spared
   it) kept its slot with no process in it: the survivors waited for a rank that
   never came, and the round after never filled (horovodrun alive, nothing
   trained, until something killed the job).  At the end of each round the rules
   free the slots of the round's failed workers, so the next world starts a
   worker in each one it keeps.  A next world with no host of the last one
   left (every survivor's host drained or gone while the others failed) has
   no survivor to hand it the state: Horovod ends the job then ("No hosts from
   previous set remaining"); with a durable checkpoint announced, as in rule 2,
   the new world resumes from it instead (counted with rule 2's rounds).
7. **A given-up world's workers stuck in its rendezvous are ended.**  A worker
   past rule 5's store, connecting its Gloo pairs to a host cut off, waits
   out the connection timeout (minutes) and the round cannot end without it.
   :data:`~.slots.GRACE_S` after a world is doomed, its workers that never got
   through ``hvd.init()`` and have not asked for the next world are ended, and
   their hosts spared (:mod:`.slots`).
8. **The job's end is no joiner's failure.**  A worker that exits 0 has
   returned from the training function: the job is done.  Join-ahead keeps
   the survivors training while a joiner starts, so a host that joins in the
   job's last seconds is still waiting in the next world's rendezvous when
   the survivors exit; it waited out its Gloo timeout, and horovodrun then
   exited 1 for a job that had finished.  Once a worker exits 0 and no worker
   that got through ``hvd.init()`` is still running, the workers still
   joining are ended, and the exit of a worker that never got through
   ``hvd.init()`` counts as 0 from then on (:mod:`.slots` tells them apart).

9. **A worker of an earlier world cannot write into this one's rendezvous.**
   Horovod clears its store when a world starts, but a worker started for an
   earlier world that reaches ``hvd.init()`` only now (a fresh worker takes
   its rank and size from the environment it was launched with) writes that
   world's Gloo addresses into the new world's keys.  Each rank publishes one
   block of addresses, one per peer, and Gloo cuts a block by its own world's
   size, so every rank of the new world that reads the stale block aborts
   (``address.cc: sizeof(impl_) == bytes.size(). 136 vs 170``: a block of a
   world of 6 read in a world of 5) and the round fails whole.  So a block
   whose length does not fit this world's size is refused with 503 (the stale
   worker fails as under rule 5, its host spared).  A stale block of a world of
   the same size is not told apart.

Contract:

* Installed by :mod:`.hook` right after ``horovod.runner.gloo_run`` executes;
  :func:`install` is idempotent, and with a Horovod other than
  :data:`SUPPORTED` (or a missing attribute) it logs one warning and leaves
  Horovod as it is.
* Rule 5 costs a world nothing until a worker fails: the driver answers
  :data:`WORLD_PATH` from its memory, and only Gloo's requests of a doomed
  world change.
* Exit codes added: ``128 + signum`` after SIGTERM/SIGINT; 1 when the process
  had to be ended :data:`STOP_GRACE_S` after its driver stopped.  Every other
  exit is horovodrun's.
* Each decision is one log line on horovodrun's stderr, prefixed ``hvd-elastic:``.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from typing import Any

from hvd_elastic import procfs
from hvd_elastic.envvars import ConfigError, parse_bool
from hvd_elastic.horovodrun import READY_SCOPE, RESUMABLE_KEY, SCOPE, WORLD_KEY, slots, startup
from hvd_elastic.horovodrun.hook import ENV

log = logging.getLogger("hvd_elastic.horovodrun")

SUPPORTED = ("0.28.1",)
# Seconds: Horovod's own cooldown formula, min * 2**failures + jitter, capped at max.  A 300 s cap held hosts
# out so long under a fault every 12 s that the 200-fault soak trained 14% of the time (benchmarks/README.md).
COOLDOWN = (2, 60)
ALL_FAILED_ROUNDS = 3
DECAY_S = 120.0  # a host's failures count toward a longer cooldown only when they come this close together
SENT_AWAY_S = 10.0  # a worker refused by rule 5 fails within Horovod's 3 retries (1.5 s); generous for a loaded box
STOP_GRACE_S = 30.0  # Horovod terminates a worker in at most 10 s (5 s SIGTERM grace, then SIGKILL, 5 s wait)
EXCEPTION_EXIT = 1  # what an uncaught Python exception in the training code exits with

# hvd-elastic's discovery as a --host-discovery-script: the installed script, a checkout's, or the subcommand.
_OUR_DISCOVERY = re.compile(r"(?:^|[\s/'\"=])(?:consul_hosts|hvd-elastic\s+discover)(?:[\s'\";|&]|$)")
_drivers: "weakref.WeakSet[Any]" = weakref.WeakSet()  # drivers whose rules apply, for the signal handler


@dataclasses.dataclass
class Job:
    """What the rules keep per driver: the last exit code of each slot and the all-failed rounds in a row."""

    exits: dict[tuple[str, int], int] = dataclasses.field(default_factory=dict)
    resumable: bool = False
    initialized: bool = False  # a worker of this job got through hvd.init() (it registered with the driver)
    decay: bool = False  # the default cooldown, whose failure count decays (an explicit one is Horovod's as given)
    all_failed: int = 0
    stopped: bool = False  # the driver's stop() ran: rule 3 and 4's guards are in place
    done: bool = False  # a worker exited 0: the training function returned, the job is over (rule 8)
    sent_away: dict[str, float] = dataclasses.field(default_factory=dict)  # client address -> last 503 (monotonic)
    spared: set[str] = dataclasses.field(default_factory=set)  # hosts not blacklisted in this round
    workers: slots.Workers = dataclasses.field(default_factory=slots.Workers)  # rule 7's handles

    def restart_refusal(self, codes: list[int | None]) -> str | None:
        """Why a round in which every worker failed (with ``codes``) must end the job; None to restart it."""
        if not self.resumable and self.initialized:
            return "no worker announced a durable checkpoint to resume from"
        if codes and all(code == EXCEPTION_EXIT for code in codes):
            return f"every worker exited {EXCEPTION_EXIT} (an exception in the training code)"
        if self.all_failed >= ALL_FAILED_ROUNDS:
            return f"{self.all_failed} such rounds in a row"
        return None

    def restart_from_checkpoint(self, what: str, codes: list[int | None]) -> bool:
        """Whether a new world may resume from the checkpoint after ``what`` (one log line either way); a
        yes counts one more such round in a row."""
        refusal = self.restart_refusal(codes)
        if refusal is not None:
            log.error("hvd-elastic: %s and %s: ending the job as Horovod does", what, refusal)
            return False
        self.all_failed += 1
        log.warning("hvd-elastic: %s: starting a new world that resumes from the newest checkpoint (%d of at most "
                    "%d such rounds in a row)", what, self.all_failed, ALL_FAILED_ROUNDS)
        return True


def applies(discovery: Any, environ: dict[str, str] | None = None) -> bool:
    """Whether the rules apply to a driver with ``discovery``: ``HVD_ELASTIC_DRIVER`` when set (a boolean),
    else whether the discovery script is hvd-elastic's.  Raises ConfigError on a value that is not a boolean."""
    value = (os.environ if environ is None else environ).get(ENV, "")
    if value:
        return parse_bool(ENV, value)
    return bool(_OUR_DISCOVERY.search(getattr(discovery, "_discovery_script", None) or ""))


def install(gloo_run: Any) -> None:
    """Patch the driver classes ``gloo_run`` uses (idempotent); see the module docstring."""
    if getattr(gloo_run, "_hvd_elastic_rules", False):
        return
    import horovod
    from horovod.runner.elastic import discovery, driver, registration
    from horovod.runner.http import http_server

    version = getattr(horovod, "__version__", "?")
    needed = [(driver.ElasticDriver, ("__init__", "start", "_handle_worker_exit", "stop", "finished", "get_results",
                                      "register_worker_server", "_update_host_assignments", "has_rank_assignment")),
              (discovery.HostState, ("blacklist",)),
              (registration.WorkerStateRegistry, ("_on_workers_recorded", "_wait")),
              (gloo_run, ("register_shutdown_event", "create_rendezvous_handler")),
              (http_server.RendezvousHTTPServer, ("init",)),
              (http_server.KVStoreHandler, ("send_status_code", "_get_value"))]
    missing = [f"{getattr(owner, '__name__', owner)}.{name}" for owner, names in needed for name in names
               if not hasattr(owner, name)]
    if version not in SUPPORTED or missing:
        log.warning("hvd-elastic: horovodrun's driver rules are written for Horovod %s, found %s%s: "
                    "left as Horovod has them", "/".join(SUPPORTED), version,
                    f" without {', '.join(missing)}" if missing else "")
        return
    _patch_driver(driver.ElasticDriver, discovery.HostState)
    _patch_registry(registration.WorkerStateRegistry, registration.SUCCESS, registration.FAILURE,
                    registration.READY)
    _patch_launcher(gloo_run)
    startup.install()
    gloo_run._hvd_elastic_rules = True


def _job(driver: Any) -> Job | None:
    return getattr(driver, "_hvd_elastic", None)


def _wrap(owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
    original = getattr(owner, name)
    setattr(owner, name, make(original))


# -- the driver ----------------------------------------------------------------------------------------------


def _patch_driver(cls: Any, host_state: type) -> None:
    _patch_driver_init(cls, host_state)
    _patch_driver_lifecycle(cls)


def _patch_driver_init(cls: Any, host_state: type) -> None:
    """Rule 1, and whether the rules apply to this driver at all."""
    signature = inspect.signature(cls.__init__)

    def init(original):
        def __init__(self, *args, **kwargs):
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            try:
                job = Job() if applies(bound.arguments["discovery"]) else None
            except ConfigError as exc:
                sys.stderr.write(f"horovodrun: {exc}\n")
                raise SystemExit(2) from None
            self._hvd_elastic = job
            if job is not None:
                _drivers.add(self)
                startup.use_forkserver()
                if bound.arguments["cooldown_range"] is None:
                    bound.arguments["cooldown_range"] = COOLDOWN
                    job.decay = True
                    log.warning("hvd-elastic: a host whose worker fails may rejoin once discovery lists it again, "
                                "after a cooldown of %d s doubling per failure within %d s of the last, up to %d s "
                                "(--blacklist-cooldown-range MIN MAX to choose; HVD_ELASTIC_DRIVER=0: Horovod's "
                                "rules)", 2 * COOLDOWN[0], DECAY_S, COOLDOWN[1])
            original(*bound.args, **bound.kwargs)
            if job is not None and job.decay:
                _forget_old_failures(self, host_state)
            if job is not None:
                _spare_sent_away(self._host_manager, job)
        return __init__

    _wrap(cls, "__init__", init)


def _patch_driver_lifecycle(cls: Any) -> None:
    """What rules 2-4 learn from the driver (exit codes, registrations) and add to its stop and its end."""

    def handle_worker_exit(original):
        def _handle_worker_exit(self, slot_info, exit_code, timestamp):
            job = _job(self)
            if job is not None:
                exit_code = _after_the_end(job, (slot_info.hostname, slot_info.local_rank), exit_code)  # rule 8
                job.exits[(slot_info.hostname, slot_info.local_rank)] = exit_code
                if exit_code != 0 and not self.finished() and \
                        self.has_rank_assignment(slot_info.hostname, slot_info.local_rank):
                    _note_sent_away(job, slot_info.hostname, slot_info.local_rank, exit_code)
                    _doom(self, f"{slot_info.hostname}[{slot_info.local_rank}] exited {exit_code}")
            return original(self, slot_info, exit_code, timestamp)
        return _handle_worker_exit

    def register_worker_server(original):
        def register_worker_server(self, host, slot, addresses, secret_key):
            job = _job(self)
            if job is not None:
                job.initialized = True
                job.workers.registered((host, slot))
            return original(self, host, slot, addresses, secret_key)
        return register_worker_server

    def stop(original):
        def stop(self, error_message=None):
            original(self, error_message)
            job = _job(self)
            if job is not None and not job.stopped:
                job.stopped = True
                with self._wait_hosts_cond:
                    self._wait_hosts_cond.notify_all()  # a wait for slots sees the shutdown now, not at its timeout
                barrier = getattr(self._worker_registry, "_barrier", None)
                if barrier is not None:
                    # Release whoever waits for a round that will never fill (rule 3).  In a thread: the barrier
                    # holds its lock while its action runs, and the action may be what called stop().
                    threading.Thread(target=barrier.abort, name="hvd-elastic-barrier", daemon=True).start()
                threading.Thread(target=_exit_if_held, args=(STOP_GRACE_S,), name="hvd-elastic-stop-guard",
                                 daemon=True).start()
        return stop

    def get_results(original):
        def get_results(self):
            results = original(self)
            if _signalled.is_set() and _job(self) is not None:
                _signalled.wait_exit()  # the signal's own thread ends the process with 128 + signum
            return results
        return get_results

    _wrap(cls, "_handle_worker_exit", handle_worker_exit)
    _wrap(cls, "_update_host_assignments", _resume_without_survivors)
    _wrap(cls, "stop", stop)
    _wrap(cls, "register_worker_server", register_worker_server)
    _wrap(cls, "start", _with_own_events)
    _wrap(cls, "get_results", get_results)


def _after_the_end(job: Job, slot: tuple[str, int], exit_code: int) -> int:
    """Rule 8: the exit code to record for ``slot``'s worker, and the joiners to end once the job is done."""
    if exit_code == 0:
        job.done = True
    elif job.done and not job.workers.exited_registered(slot):
        log.warning("hvd-elastic: %s[%d] exited %d after the job finished, before it ever joined: counted as done",
                    *slot, exit_code)
        exit_code = 0
    if job.done and not job.workers.any_registered():
        for host, local_rank in job.workers.unregistered():
            log.warning("hvd-elastic: the job finished while %s[%d] was joining: ending it", host, local_rank)
            job.workers.end((host, local_rank))
    return exit_code


def _with_own_events(original):
    """Rule 7's handle on each worker: an event of its own among those that end it."""

    def start(self, num_proc, create_worker_fn):
        job = _job(self)
        if job is not None:
            create_worker_fn = job.workers.wrap(create_worker_fn)
        return original(self, num_proc, create_worker_fn)
    return start


def _resume_without_survivors(original):
    """Rule 6's second half: a next world that keeps no host of the last one starts from the checkpoint."""

    def _update_host_assignments(self, current_hosts):
        try:
            return original(self, current_hosts)
        except RuntimeError as exc:
            job = _job(self)
            if job is None or not self._host_assignments or "No hosts from previous set" not in str(exc):
                raise
            if not job.restart_from_checkpoint("no host of the last world is in the next one, so no survivor can "
                                               "hand it the state", []):
                raise
            self._host_assignments = {}  # every slot of the new world gets a new worker
            return original(self, current_hosts)
    return _update_host_assignments


def _forget_old_failures(driver: Any, host_state: type) -> None:
    """Make the driver's hosts count only failures within :data:`DECAY_S` of each other toward their cooldown.

    Horovod's count never decays: on a long job every host would end up held off for the whole
    maximum after any failure.  A host that flaps keeps doubling; one that failed once an hour does not.
    """

    class Decaying(host_state):
        _last_failure = 0.0

        def blacklist(self):
            now = time.time()
            if now - self._last_failure > DECAY_S:
                self._blacklist_count = 0
            self._last_failure = now
            super().blacklist()

    manager = driver._host_manager
    with driver._wait_hosts_cond:  # the discovery thread (already started) creates host states under it
        states = manager._hosts_state
        states.default_factory = lambda: Decaying(COOLDOWN)
        for host, state in list(states.items()):
            states[host] = Decaying.__new__(Decaying)
            states[host].__dict__.update(state.__dict__)


def _exit_if_held(grace: float) -> None:
    """Rule 4's last line: the driver stopped ``grace`` s ago and the process still lives."""
    time.sleep(grace)
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    stacks = "".join(f"thread {names.get(ident, ident)}:\n{''.join(traceback.format_stack(frame))}"
                     for ident, frame in sys._current_frames().items())
    sys.stderr.write(f"hvd-elastic: horovodrun's driver stopped {grace:.0f} s ago and the process is still held; "
                     f"its threads:\n{stacks}")
    _end_children(0.0)
    _exit(1)


def _exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _end_children(grace: float) -> None:
    """Wait up to ``grace`` s for horovodrun's sessions (workers, discovery calls) to end, then SIGKILL them.

    A session is a descendant that leads its own session: ``safe_shell_exec``'s middleman calls ``setsid()``
    (a grandchild when a forkserver made it, :mod:`.startup`).  Other children (multiprocessing's resource
    tracker and forkserver) end with this process.
    """
    deadline = time.monotonic() + grace
    while (sessions := _sessions()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in sessions:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _sessions() -> list[int]:
    return procfs.session_leaders(os.getpid(), zombies=False)


# -- the registry: rounds --------------------------------------------------------------------------------------


def _patch_registry(cls: Any, success: str, failure: str, ready: str) -> None:
    def on_workers_recorded(original):
        def _on_workers_recorded(self):
            job = _job(self._driver)
            if job is not None:
                _free_failed_slots(self._driver, job, self.get(failure))
            if job is None or not _restarted_all(self, job, success, failure, ready):
                original(self)
            if job is not None:
                job.spared.clear()  # a sparing covers its own round's blacklisting, never a later one
                job.sent_away.clear()  # a refusal explains a failure of its own world only
        return _on_workers_recorded

    def wait(original):
        def _wait(self, key, state, rendezvous_id):
            if _job(self._driver) is None:
                return original(self, key, state, rendezvous_id)
            if self._driver.finished():
                return rendezvous_id  # the job is over: no round will form to wait for (rule 3)
            try:
                return original(self, key, state, rendezvous_id)
            except threading.BrokenBarrierError:
                if self._driver.finished():
                    return rendezvous_id
                raise
        return _wait

    _wrap(cls, "_on_workers_recorded", on_workers_recorded)
    _wrap(cls, "_wait", wait)


def _free_failed_slots(driver: Any, job: Job, failed: set[tuple[str, int]]) -> None:
    """Rule 6: take the round's failed workers' slots out of the world the next one is made from, so
    Horovod's ``_update_host_assignments`` counts them as pending and starts a worker in each it keeps."""
    assignments = driver._host_assignments
    for host, slot in sorted(failed):
        held = assignments.get(host, [])
        kept = [info for info in held if info.local_rank != slot]
        if len(kept) == len(held):
            continue
        if kept:
            assignments[host] = kept
        else:
            del assignments[host]
        log.warning("hvd-elastic: %s[%d] exited %s: a new worker takes its slot if the next world keeps it",
                    host, slot, job.exits.get((host, slot)))


def _restarted_all(registry: Any, job: Job, success: str, failure: str, ready: str) -> bool:
    """Rule 2, in the barrier's action: True when a round that Horovod would end the job for was restarted.

    Horovod ends it when every worker failed, and also when every host of the round has a failed worker
    ("blacklisted slots count == N -> stop running": one host's crash in a world on one host, or failures
    spread over every host), although under a cooldown each of those hosts comes back.  Survivors on such
    hosts have no place in the next world, so it resumes from the checkpoint either way.
    """
    failed = registry.get(failure)
    if registry.count(success) or not registry.size():
        return False
    out = {host for host, _ in failed if host not in job.spared} | {
        host for host, _ in registry.get_recorded_slots() if registry._host_manager.is_blacklisted(host)}
    if len(failed) == registry.size():
        what = "every worker of the round failed"
    elif all(host in out for host, _ in registry.get_recorded_slots()):
        what = "every host of the round had a worker fail"
    else:
        job.all_failed = 0  # a round got through
        return False
    codes = sorted({job.exits.get(key) for key in failed}, key=lambda code: (code is None, code))
    if not job.restart_from_checkpoint(f"{what} (exit codes {codes})", codes):
        return False
    for host, _ in failed:
        registry._host_manager.blacklist(host)  # each returns after its cooldown, when discovery lists it
    # No survivor holds the state: the new world need not include a previous host to sync from.
    registry._driver._host_assignments = {}
    try:
        registry._reset_count += 1
        registry._driver.resume()
    except Exception:  # noqa: BLE001 -- Horovod's own handling of a failed resume
        log.exception("failed to activate new hosts -> stop running")
        registry._driver.stop()
    return True


# -- the launcher: signals and the checkpoint announcement -----------------------------------------------------


def _patch_launcher(gloo_run: Any) -> None:
    def register_shutdown_event(original):
        def register():
            event = original()
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, _on_signal(signal.getsignal(signum)))
            return event
        return register

    def create_rendezvous_handler(original):
        def create(driver):
            handler = original(driver)
            job = _job(driver)
            if job is None:
                return handler

            class Handler(handler):
                def do_GET(self):
                    parts = self.path.split("/")
                    if len(parts) == 3 and _is_gloo_scope(parts[1]) and _doomed(self.server):
                        self._send_away()  # rule 5: this world will never form
                        return
                    super().do_GET()

                def do_PUT(self):
                    parts = self.path.split("/")
                    length = int(self.headers.get("Content-Length") or 0)
                    if len(parts) == 3 and parts[1] == _GLOO_GLOBAL and parts[2].isdigit() \
                            and _stale_block(self.server, parts[2], length):
                        self.rfile.read(length)
                        self._send_away()  # rule 9: addresses of an earlier world
                        return
                    super().do_PUT()

                def _send_away(self):
                    job.sent_away[self.client_address[0]] = time.monotonic()
                    self.send_status_code(503)

                def _get_value(self, scope, key):
                    if scope == SCOPE and key == WORLD_KEY:
                        return _world(driver, self.server)
                    return super()._get_value(scope, key)

                def _put_value(self, scope, key, value):
                    if scope == SCOPE and key == RESUMABLE_KEY and not job.resumable:
                        job.resumable = True
                        log.info("hvd-elastic: a worker announced a durable checkpoint")
                    super()._put_value(scope, key, value)

            return Handler
        return create

    _wrap(gloo_run, "register_shutdown_event", register_shutdown_event)
    _wrap(gloo_run, "create_rendezvous_handler", create_rendezvous_handler)


# -- rule 5: the forming world's state, in the driver's store ------------------------------------------------

_DOOMED_KEY = "doomed"  # in SCOPE, so the store's clearing at the next world's start lifts it
_GLOO_GLOBAL = "global"  # Gloo's global context's scope: each rank's address under its rank


def _doom(driver: Any, why: str) -> None:
    server = getattr(driver._rendezvous, "_httpd", None)
    if server is None:
        return  # not started: no world to give up
    with server.cache_lock:
        scope = server.cache.setdefault(SCOPE, {})
        first = _DOOMED_KEY not in scope
        scope[_DOOMED_KEY] = why.encode()
    if first:
        log.warning("hvd-elastic: %s: this world cannot form any more; its workers are sent on to the next", why)
        job = _job(driver)
        if job is not None:
            slots.end_stuck_later(driver, job.workers, lambda: _doomed(server), job.spared)  # rule 7


def _note_sent_away(job: Job, host: str, slot: int, exit_code: int) -> None:
    """A worker whose rendezvous rule 5 refused just before it failed did not fail for its host: spare it."""
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return
    refused = job.sent_away.get(address)
    if refused is not None and time.monotonic() - refused < SENT_AWAY_S:
        job.spared.add(host)
        log.warning("hvd-elastic: %s[%d] exited %d after its world was given up: %s is not held out for it",
                    host, slot, exit_code, host)


def _spare_sent_away(manager: Any, job: Job) -> None:
    """Skip the blacklisting of a spared host in the round being recorded (Horovod blacklists the host of
    every failed worker)."""
    blacklist = manager.blacklist

    def spare_or_blacklist(host):
        if host not in job.spared:
            blacklist(host)

    manager.blacklist = spare_or_blacklist


def _doomed(server: Any) -> bool:
    with server.cache_lock:
        return _DOOMED_KEY in server.cache.get(SCOPE, {})


# gloo/transport/tcp/address.h: one pair's address is a sockaddr_storage (128 bytes on Linux) and a sequence number.
GLOO_ADDRESS_BYTES = 136


def _stale_block(server: Any, rank: str, length: int) -> bool:
    """Rule 9: whether ``length`` bytes written as rank ``rank``'s Gloo addresses cannot be this world's (one
    address per peer: ``(size - 1) * GLOO_ADDRESS_BYTES``).  Only Gloo's own keys, the bare ranks, are such
    blocks: Horovod keeps other values in the same scope."""
    size = getattr(server, "scope_size", {}).get(_GLOO_GLOBAL)
    if not isinstance(size, int) or size < 2 or length == (size - 1) * GLOO_ADDRESS_BYTES:
        return False
    log.warning("hvd-elastic: a worker wrote %d bytes of Gloo addresses as rank %s, a block of a world of %s, "
                "into the rendezvous of a world of %d: refused, it is of an earlier world", length, rank,
                f"{length / GLOO_ADDRESS_BYTES + 1:g}", size)
    return True


def _is_gloo_scope(scope: str) -> bool:
    # Gloo's three contexts (horovod/common/gloo/gloo_context.cc), as http_server.py sizes them.
    return scope == _GLOO_GLOBAL or scope.startswith(("local_", "cross_"))


def _world(driver: Any, server: Any) -> bytes:
    """The forming world, as :data:`hvd_elastic.horovodrun.WORLD_PATH` documents it."""
    assignments = dict(driver._rank_assignments)  # replaced whole at every world's start, never mutated
    with server.cache_lock:
        doomed = server.cache.get(SCOPE, {}).get(_DOOMED_KEY, b"").decode()
        keys = set(server.cache.get(READY_SCOPE, {})) | set(server.cache.get(_GLOO_GLOBAL, {}))
    present = sorted(int(key) for key in keys if key.isdigit())
    hosts = [assignments[rank].hostname for rank in sorted(assignments)]
    return json.dumps({"hosts": hosts, "present": present, "doomed": doomed,
                       "min_np": driver._min_num_proc}).encode()


class _Signalled:
    """Set once horovodrun got SIGTERM or SIGINT: from then on one thread owns the way out."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def is_set(self) -> bool:
        return self._event.is_set()

    def claim(self) -> bool:
        """True for the first signal only."""
        first = not self._event.is_set()
        self._event.set()
        return first

    @staticmethod
    def wait_exit() -> None:
        while True:  # _stop_and_exit calls os._exit; a main thread that got here first waits for it
            time.sleep(3600)


_signalled = _Signalled()


def _on_signal(previous: Any) -> Callable:
    def handle(signum, frame):
        if callable(previous):
            previous(signum, frame)  # Horovod's: every worker session is terminated
        if _drivers and _signalled.claim():
            threading.Thread(target=_stop_and_exit, args=(signum,), name="hvd-elastic-signal", daemon=True).start()
    return handle


def _stop_and_exit(signum: int) -> None:
    name = signal.Signals(signum).name
    try:
        sys.stderr.write(f"hvd-elastic: horovodrun got {name}: stopping the driver and its workers\n")
        for driver in list(_drivers):
            driver.stop(error_message=f"horovodrun got {name}")
        _end_children(STOP_GRACE_S)
    finally:
        _exit(128 + signum)

