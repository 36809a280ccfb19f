"""The watcher: one long-running blocking query that keeps a host cache file fresh.

``hvd-elastic discover --watch --cache-file PATH`` runs it in the foreground
(an operator's cache, ``scripts/systemd/hvd-elastic-discover.service``);
discovery's first call of a job starts one in the background
(:func:`ensure_running`), tied to the horovodrun process.

The loop is :func:`hvd_elastic.health.watch.follow` (Consul's rules for
blocking queries); the publisher here turns what it reads into the file:

* a return is no promise of change: every successful answer, changed or
  not, rewrites the file with its answer time, which is what keeps it fresh;
* a failure (unreachable, 5xx, timeout, ``X-Consul-LastContact`` above
  ``--max-stale``, no ``X-Consul-Index``) marks the file failed AT ONCE, so
  readers query Consul directly instead of trusting the old list, while the
  loop backs off and re-reads.

Lifetime: one watcher per file (an ``flock`` on ``PATH.lock``); with a job it
exits within half a second of that process ending, and also once no
discovery call has read the cache for ``IDLE_EXIT_S`` (readers touch the
lock file; a stand-in "job" such as a test runner may live long after its
last call, and a later call simply starts a new watcher); without a job it
runs until SIGTERM/SIGINT.  It removes its file (and lock) on the way out.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time

from hvd_elastic.discovery import cache, jobdir
from hvd_elastic.discovery.cachekey import ANSWER_SOURCES, answer_count_path, mark_read, without_token_flags
from hvd_elastic.health import hosts as hostlib
from hvd_elastic.health.watch import Fetch, follow

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: the direct discovery path imports this module
if TYPE_CHECKING:
    from hvd_elastic.consul.config import ConsulConfig

log = logging.getLogger("hvd_elastic.discovery.watch")

JOB_POLL_S = 0.5
LOG_LIMIT = 1 << 20
IDLE_EXIT_S = 60.0


def body_of(decisions: list[hostlib.Decision]) -> tuple[bytes, bytes]:
    """(host lines, warning lines) exactly as a direct discovery call prints them."""
    hosts = hostlib.format_hosts(hostlib.merge(decisions)).encode()
    # One line each: repr() already escapes a newline inside a value, a reason carries none.
    warnings = "".join(line.replace("\r", " ").replace("\n", " ") + "\n" for line in hostlib.drop_warnings(decisions))
    return hosts, warnings.encode("utf-8", "replace")


class Publisher:
    """Writes the watcher's answers and failures to the cache file; stops writing once closed."""

    def __init__(self, path: str, key: str, max_age: float, mode: int):
        self.path, self.key, self.max_age, self.mode = path, key, max_age, mode
        self.pid = os.getpid()
        self.started = jobdir.proc_stat(self.pid)[1]
        self._lock = threading.Lock()
        self._closed = False
        self.broken = threading.Event()  # set when the file cannot be written
        self._last = cache.Record(key, self.pid, self.started, max_age, 0.0, 0.0, 0, error="no answer yet")

    def answer(self, decisions: list[hostlib.Decision], index: int, answered: float) -> None:
        hosts, warnings = body_of(decisions)
        rec = cache.Record(self.key, self.pid, self.started, self.max_age, answered, time.time(), index,
                           hosts=hosts, warnings=warnings)
        if self._last.error:
            log.info("cache %s: Consul answered (index %d, %d hosts)", self.path, index, hosts.count(b"\n"))
        self._write(rec)

    def failure(self, error: BaseException | str) -> None:
        error = str(error)
        if not self._last.error:
            log.warning("cache %s: %s; readers query Consul directly until it answers again", self.path, error)
        last = self._last
        self._write(cache.Record(self.key, self.pid, self.started, self.max_age, last.answered, last.wall,
                                 last.index, error=error or "request failed"))

    def _write(self, rec: cache.Record) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                cache.write(self.path, rec, self.mode)
            except OSError as exc:  # its directory was removed, the disk is full: nothing left to keep fresh
                log.error("cannot write %s: %s; exiting", self.path, exc)
                self.broken.set()
                return
            self._last = rec

    def close(self) -> None:
        """Stop writing and remove the file (a reader then finds no cache, not a dead one) and its answer counts."""
        with self._lock:
            self._closed = True
            for name in (self.path, *(answer_count_path(self.path, source) for source in ANSWER_SOURCES)):
                try:
                    os.unlink(name)
                except OSError:
                    pass


def try_lock(path: str) -> int | None:
    """An fd holding an exclusive flock on ``path``, or None when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def run(path: str, key: str, fetch: Fetch, failures: tuple[type[BaseException], ...], *, job: tuple[str, str] | None,
        max_age: float, mode: int = 0o600, reap_grace: float | None = None, metrics_addr: str | None = None) -> int:
    """Keep ``path`` fresh until ``job`` ends or a signal arrives; exit status 0.

    With a ``job`` and a ``reap_grace`` (seconds), also end the job's worker
    sessions to every host Consul judges lost (:mod:`.reaper`).  With a
    ``metrics_addr``, serve the watcher's metrics there
    (:mod:`hvd_elastic.discovery.watch_metrics`; one logged line and no metrics when it cannot).
    """
    from hvd_elastic.options import stop_on_signals  # the watcher's own process: start-up cost does not matter

    lock_path = path + ".lock"
    lock = try_lock(lock_path)
    if lock is None:
        log.info("another watcher keeps %s fresh; exiting", path)
        return 0
    publisher = Publisher(path, key, max_age, mode)
    with stop_on_signals(log, "removing the cache and exiting") as stop:
        listeners = []
        if job is not None and reap_grace is not None:
            from hvd_elastic.discovery.reaper import Reaper

            listeners.append(Reaper(int(job[0]), reap_grace))
            listeners[-1].start(stop)
        exporter = _serve_metrics(metrics_addr, path, listeners) if metrics_addr else None
        loop = threading.Thread(target=follow, args=(fetch, publisher, stop, failures, listeners), name="watch",
                                daemon=True)
        loop.start()
        log.info("watching for %s (pid %d, job %s)", path, os.getpid(), "-".join(job) if job else "none")
        try:
            while not stop.wait(JOB_POLL_S):
                if job is not None and not jobdir.alive(int(job[0]), job[1]):
                    log.info("job process %s is gone; exiting", job[0])
                    break
                if job is not None and _idle_for(lock_path) > IDLE_EXIT_S:
                    log.info("no discovery call read the cache for %.0f s; exiting", IDLE_EXIT_S)
                    break
                if not loop.is_alive() or publisher.broken.is_set():
                    log.error("the watch loop stopped; exiting")
                    return 1
        finally:
            stop.set()
            if exporter is not None:
                exporter.stop()
            publisher.close()
            try:
                os.unlink(lock_path)
            except OSError:
                pass
            os.close(lock)
    return 0


def _serve_metrics(addr: str, path: str, listeners: list):
    """The watcher's exporter (its metrics join ``listeners``), or None after one logged line."""
    try:  # the job's own watcher runs under -I -S: no site-packages
        from hvd_elastic.metrics.exporter import Exporter
        from hvd_elastic.discovery.watch_metrics import WatcherMetrics
    except ImportError as exc:
        log.error("watcher metrics are off: %s (run the watcher as `hvd-elastic discover --watch`)", exc)
        return None
    metrics = WatcherMetrics(path)
    exporter = Exporter(metrics.registry, "watcher")
    if not exporter.start(addr, "--metrics-addr"):
        return None
    listeners.append(metrics)
    _open_answer_counts(path)
    return exporter


def _open_answer_counts(path: str) -> None:
    """Create the answer counters writable by every job's user (the cache's folder may be root's, as
    systemd's ``RuntimeDirectory`` is): a count is all anyone can spoil there."""
    for source in ANSWER_SOURCES:
        counter = answer_count_path(path, source)
        try:
            fd = os.open(counter, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        except OSError as exc:
            log.warning("cannot create %s: %s; answers are not counted", counter, exc)
            continue
        try:
            os.fchmod(fd, 0o666)  # past the umask
        finally:
            os.close(fd)


def _idle_for(lock_path: str) -> float:
    """Seconds since a reader last touched the lock file (see :func:`.cachekey.mark_read`)."""
    try:
        return time.time() - os.stat(lock_path).st_mtime
    except OSError:
        return float("inf")


def is_running(path: str) -> bool:
    """True when a watcher holds the lock of ``path``."""
    try:
        fd = try_lock(path + ".lock")
    except OSError:
        return False
    if fd is None:
        return True
    os.close(fd)
    return False


def ensure_running(path: str, key: str, job: tuple[int, str], argv: list[str], config: ConsulConfig,
                   command: list[str]) -> bool:
    """Start a background watcher for ``path`` unless one runs; True when one was started.

    The child is ``command`` (it runs discovery's command line with the
    arguments that follow: ``--watch`` and ``argv``), in its own session, with
    no inherited descriptor (horovodrun waits for EOF on the script's stdout),
    and its output appended to ``PATH.log``.  It gets the token the way
    ``config`` (a :class:`~hvd_elastic.consul.config.ConsulConfig`) got it:
    a token file's path as ``CONSUL_HTTP_TOKEN_FILE`` (it then follows
    rotation), else the value as ``CONSUL_HTTP_TOKEN``; never on its command line.
    """
    running = is_running(path)  # creates the lock file when missing
    mark_read(path)
    if running:
        return False
    import subprocess

    cmd = [*command, "--watch", "--cache-file", path, "--cache-key", key, "--job", f"{job[0]}-{job[1]}",
           *without_token_flags(argv)]
    env = {k: v for k, v in os.environ.items() if k not in ("CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE")}
    if config.token_file:
        env["CONSUL_HTTP_TOKEN_FILE"] = config.token_file
    elif config.token:
        env["CONSUL_HTTP_TOKEN"] = config.token
    log_path = path + ".log"
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if os.fstat(log_fd).st_size > LOG_LIMIT:
            os.ftruncate(log_fd, 0)
        subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd,
                         start_new_session=True, close_fds=True, cwd="/")
    finally:
        os.close(log_fd)
    return True
