"""``hvd-elastic launch [--max-restarts N] -- horovodrun ...``: horovodrun, relaunched when the job dies.

Elastic horovodrun survives hosts that come and go, but Horovod still ends the
whole job when every worker of one round fails.  One lost host can cause that:
a worker still inside ``hvd.init()`` when a peer dies cannot reset, it aborts
once the Gloo rendezvous times out, so a host lost during a rendezvous (a job's
start, any reset) fails the whole round and horovodrun exits ("failure count ==
N -> stop running"; horovod/horovod#3264).  The chaos soak
(``testbed/chaos.py``, in the checkout) meets it a few times in every hundred
overlapping faults.  A Kubernetes Job relaunches its launcher pod
(``backoffLimit``); this is the same for a launcher that nothing relaunches
(bare metal, a Slurm allocation): with ``@hvd_elastic.run`` and a checkpoint
directory, the new job resumes from the newest durable checkpoint.

Contracts:

* the command exits 0: done, exit 0;
* its stdout is this process's, its stderr passes through this one, unchanged;
* it ends any other way (a code, a signal) and restarts remain: one stderr line
  naming how it ended and horovodrun's reason (from its stderr), ``--restart-delay`` seconds, then
  the same command again, with ``HVD_ELASTIC_LAUNCH_ATTEMPT`` (0 the first
  time) in its environment;
* with ``--progress-file PATH --stall-timeout S``, a job whose PATH has not
  changed for S seconds (``@hvd_elastic.run``'s event log gets a line per
  commit) is stuck: its process group gets SIGTERM, SIGKILL after 15 s, and it
  is relaunched like a job that died.  The soak saw Horovod's driver wedge so,
  horovodrun alive with no worker left, after a stream of overlapping faults
  (consistent with horovod/horovod#3014, a worker failing while the driver
  handles a finished round; not confirmed);
* exit 2, a usage error, is never relaunched: it would fail the same way;
* SIGTERM, SIGINT and SIGHUP are passed on to the command, and nothing is
  relaunched after one: a scheduler that stops the job stops it;
* the exit code is the command's last (128 + N after signal N), 127 when it
  cannot be started; if this process is SIGKILLed, the command gets SIGTERM.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from hvd_elastic.options import command_name, fail, non_negative_seconds

log = logging.getLogger("hvd_elastic.launch")

ATTEMPT_ENV = "HVD_ELASTIC_LAUNCH_ATTEMPT"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
REASON_MARKERS = ("stuck", "stop running", "Error", "error")  # what names horovodrun's reason in its last lines
TAIL_LINES = 200  # lines of the command's output kept to find its reason
POLL_S = 1.0  # how often the progress file is looked at
KILL_GRACE_S = 15.0  # a stuck job's SIGTERM -> SIGKILL
_PR_SET_PDEATHSIG = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-restarts", type=_count, default=3, metavar="N",
                        help="relaunch a job that died at most N times (default %(default)s; 0: never)")
    parser.add_argument("--restart-delay", type=non_negative_seconds, default=1.0, metavar="DURATION",
                        help="wait before each relaunch (seconds, or e.g. 500ms, 1m; default %(default)ss)")
    parser.add_argument("--progress-file", type=Path, metavar="PATH",
                        help="a file the job writes to as it trains, such as @hvd_elastic.run's event log "
                             "(RUN_DIR/events.jsonl: a line per commit); with --stall-timeout")
    parser.add_argument("--stall-timeout", type=non_negative_seconds, default=0.0, metavar="DURATION",
                        help="end and relaunch the job when --progress-file has not changed for this long "
                             "(seconds, or e.g. 10m; default 0: never; make it longer than any wait for hosts or "
                             "checkpoint write)")
    # dest "argv": "command" is the subcommand's own name in hvd_elastic.cli's namespace.
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="horovodrun and its arguments")


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
    return int(text)


def run(args: argparse.Namespace) -> int:
    prog = command_name(args)
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        return fail(prog, "no command to launch (expected: hvd-elastic launch [--max-restarts N] -- horovodrun ...)",
                    2)
    if args.progress_file is None and args.stall_timeout:
        return fail(prog, f"--stall-timeout {args.stall_timeout:g}s needs --progress-file PATH, the file whose "
                          "changes show the job is alive (@hvd_elastic.run's event log: RUN_DIR/events.jsonl)", 2)
    if args.progress_file is not None and not args.stall_timeout:
        return fail(prog, f"--progress-file {str(args.progress_file)!r} needs --stall-timeout DURATION, how long "
                          "it may stay unchanged before the job counts as stuck", 2)
    return Launcher(command, args.max_restarts, args.restart_delay, args.progress_file, args.stall_timeout).run()


class Launcher:
    """Runs ``command`` until it succeeds, is stopped, or has died ``max_restarts`` + 1 times."""

    def __init__(self, command: list[str], max_restarts: int, restart_delay: float,
                 progress_file: Path | None = None, stall_timeout: float = 0.0):
        self.command, self.max_restarts, self.restart_delay = command, max_restarts, restart_delay
        self.progress_file, self.stall_timeout = progress_file, stall_timeout
        self.child: subprocess.Popen | None = None
        self.stopped_by: int | None = None

    def run(self) -> int:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._stop)
        attempt = 0
        while True:
            returncode, reason = self._attempt(attempt)
            code = 128 - returncode if returncode < 0 else returncode
            if code in (0, 2, 127) or self.stopped_by is not None:
                return code
            if attempt == self.max_restarts:
                log.error("%s %s (%s); no restarts left (--max-restarts %d)", self.command[0], _ended(returncode),
                          reason, self.max_restarts)
                return code
            attempt += 1
            log.warning("%s %s (%s); relaunch %d of %d in %g s: it resumes from its newest checkpoint",
                        self.command[0], _ended(returncode), reason, attempt, self.max_restarts, self.restart_delay)
            time.sleep(self.restart_delay)
            if self.stopped_by is not None:  # stopped during the delay
                return code

    def _attempt(self, attempt: int) -> tuple[int, str]:
        """Run the command once; (its returncode, horovodrun's reason, from its stderr).

        Its stdout is ours; its stderr passes through this process (where horovodrun logs
        why it stopped), line by line and unbuffered, to our stderr.
        """
        try:
            # Its own process group: a terminal's Ctrl-C reaches this process only, which passes it on once.
            self.child = subprocess.Popen(self.command, env={**os.environ, ATTEMPT_ENV: str(attempt)},
                                          stderr=subprocess.PIPE, process_group=0, preexec_fn=_die_with_parent)
        except OSError as exc:
            log.error("cannot run %s: %s", self.command[0], exc.strerror or exc)
            return 127, ""
        tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        relay = threading.Thread(target=_relay, args=(self.child.stderr, tail), daemon=True)
        relay.start()
        started = time.time()
        while True:
            try:
                returncode = self.child.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            if (self.stall_timeout
                    and (quiet := time.time() - max(started, _mtime(self.progress_file))) > self.stall_timeout):
                tail.append(f"no progress in {self.progress_file} for {quiet:.0f} s: the job is stuck")
                log.warning("%s: no change in %s for %.0f s (--stall-timeout %g): ending the stuck job",
                            self.command[0], self.progress_file, quiet, self.stall_timeout)
                returncode = self._end_stuck_child()
                break
        relay.join(timeout=5)
        return returncode, _reason(tail)

    def _end_stuck_child(self) -> int:
        """SIGTERM the command's process group, SIGKILL after :data:`KILL_GRACE_S`; its returncode."""
        child = self.child
        assert child is not None  # only while a command runs
        for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, sig)
            try:
                return child.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        return child.wait()

    def _stop(self, signum, frame) -> None:
        self.stopped_by = signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)


def _relay(stream, tail: collections.deque) -> None:
    """The command's stderr to ours, line by line and unbuffered, its last lines kept in ``tail``."""
    with stream:
        for raw in iter(stream.readline, b""):
            sys.stderr.buffer.write(raw)
            sys.stderr.buffer.flush()
            tail.append(raw.decode(errors="replace").rstrip())


def _mtime(path: Path | None) -> float:
    try:
        return path.stat().st_mtime if path is not None else 0.0
    except OSError:
        return 0.0


def _reason(lines) -> str:
    """The most telling of the command's last lines: Horovod's 'stop running' verdict, else an error line."""
    lines = [line for line in lines if line.strip()]
    for marker in REASON_MARKERS:
        found = [line for line in lines if marker in line]
        if found:
            return found[-1].strip()[:300]
    return lines[-1].strip()[:300] if lines else "no output"


def _ended(returncode: int) -> str:
    if returncode >= 0:
        return f"exited with {returncode}"
    try:
        return f"was killed by {signal.Signals(-returncode).name}"
    except ValueError:  # a real-time signal has no name
        return f"was killed by signal {-returncode}"


def _die_with_parent() -> None:
    # Runs in the child before exec: SIGTERM when this launcher dies, even of SIGKILL.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
