"""The launcher's side of a lost host: end horovodrun's worker sessions to it.

horovodrun's elastic driver re-forms the job only once every worker of the old
world has recorded itself ready or failed.  A worker on a host that froze or
dropped off the network does neither, and horovodrun learns of its end only
when its ``ssh`` client exits: with OpenSSH's default client settings (no
``ServerAliveInterval``) that is when TCP gives up, many minutes later, and
the survivors sit in the rendezvous all that time.

The discovery watcher runs on the launch host for the job's whole life and
already follows the service's health; with :class:`Reaper` it also judges the
job's hosts (:class:`.lost.LostHostJudge`) and, once a host is lost, SIGKILLs
each of horovodrun's sessions for it -- if the host no longer answers
(:mod:`.host_answers`: its sshd does not greet, or its local workers are
stopped).  horovodrun then records those workers as failed (and blacklists the
host, as for any failure), whatever the ssh configuration says.  A host that
still answers (its node agent died, its workers train on) keeps its sessions:
discovery's removal resizes the job gracefully; the reaper asks again at every
poll while the host stays lost, at most every :data:`REPROBE_S`.

How a session is found (Horovod 0.28's ``safe_shell_exec``): horovodrun forks
one middleman per worker, which calls ``setsid()`` and runs the worker command
through a shell; that command carries ``HOROVOD_HOSTNAME=<host>`` (in ssh's
remote command, or, for a local host, in the worker's own environment).  So a
session is a process under horovodrun that leads its own session, and its host is
the first ``HOROVOD_HOSTNAME=`` found among that session's processes.  (Under
hvd-elastic's rules the middlemen are forked by a forkserver that horovodrun
started, :mod:`hvd_elastic.horovodrun.startup`: sessions are looked for among
all of horovodrun's descendants.)  Killing
the session's process group ends the shell, the ssh client or the local
worker, and the middleman, whose exit status horovodrun records.

On unless ``HVD_ELASTIC_HEALTH_REAP=0``.  Linux ``/proc`` only.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time

from hvd_elastic.envvars import env_bool
from hvd_elastic import procfs
from hvd_elastic.discovery import host_answers
from hvd_elastic.health import lost

log = logging.getLogger(__name__)

ENV = "HVD_ELASTIC_HEALTH_REAP"
REPROBE_S = 5.0  # a lost host that still answered is probed again no sooner (each probe is an sshd log line)

_HOSTNAME = re.compile(rb"(?:^|[\s'\"\0])HOROVOD_HOSTNAME=([A-Za-z0-9.-]+)")


def enabled(environ=os.environ) -> bool:
    """Whether ``HVD_ELASTIC_HEALTH_REAP`` leaves the reaper on (on when unset); ConfigError for no boolean."""
    return env_bool(ENV, True, environ)


def _host_of(pid: int) -> str | None:
    for name in ("cmdline", "environ"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                found = _HOSTNAME.search(f.read())
        except OSError:
            continue
        if found:
            return found.group(1).decode("ascii")
    return None


def worker_sessions(job_pid: int) -> dict[str, list[int]]:
    """host -> session ids of ``job_pid``'s worker sessions (module docstring)."""
    stats = procfs.all_stats()
    leaders = set(procfs.session_leaders(job_pid, stats))
    members: dict[int, list[int]] = {}
    for pid, st in stats.items():
        if st.sid in leaders:
            members.setdefault(st.sid, []).append(pid)
    sessions: dict[str, list[int]] = {}
    for sid, pids in members.items():
        host = next((h for h in map(_host_of, sorted(pids)) if h), None)
        if host is not None:
            sessions.setdefault(host, []).append(sid)
    return sessions


def end_sessions(sids: list[int]) -> list[int]:
    """SIGKILL every process group in ``sids``; the ones that were still there."""
    ended = []
    for sid in sids:
        try:
            os.killpg(sid, signal.SIGKILL)
        except OSError:
            continue
        ended.append(sid)
    return ended


class Reaper:
    """Ends ``job_pid``'s worker sessions to each host Consul judges lost; feed it like a publisher."""

    def __init__(self, job_pid: int, grace: float, answers=host_answers.answers, clock=time.monotonic):
        self.job_pid = job_pid
        self.answers = answers  # (session ids) -> (whether the host answers, how that was told)
        self.clock = clock
        self._answered: dict[str, float] = {}  # host -> when it last answered while lost
        self.judge = lost.LostHostJudge(grace, watched=lambda: worker_sessions(job_pid), on_lost=self._reap)

    # watch.follow's listener interface
    def answer(self, decisions, index: int, answered: float) -> None:
        self.judge.answer(decisions, index, answered)

    def failure(self, error: BaseException | str) -> None:
        self.judge.failure(str(error))

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.judge.run, args=(stop,), name="reaper", daemon=True)
        thread.start()
        return thread

    def _reap(self, host: str, why: str) -> bool:
        """End ``host``'s sessions unless it still answers; False: ask again at the next poll."""
        sids = worker_sessions(self.job_pid).get(host, [])
        if not sids:
            self._answered.pop(host, None)
            return True
        last = self._answered.get(host)
        if last is not None and self.clock() - last < REPROBE_S:
            return False
        alive, how = self.answers(sids)
        if alive:
            if last is None:
                log.warning("host %s failed its health checks in Consul (%s), but it still answers (%s): not ending "
                            "its worker sessions; discovery's removal resizes the job", host, why or "critical", how)
            self._answered[host] = self.clock()
            return False
        self._answered.pop(host, None)
        ended = end_sessions(sids)
        if ended:
            log.warning("host %s failed its health checks in Consul (%s) and does not answer (%s): ended horovodrun's "
                        "%d worker session(s) to it, so the job re-forms without it instead of waiting for its ssh "
                        "connection to time out", host, why or "critical", how, len(ended))
        return True
