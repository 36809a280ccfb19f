"""``hvd-elastic exec -- python train.py ...``: the worker command, started through a standby when one is there.

horovodrun runs this on every worker start, so it is stdlib only (no torch,
no argparse before the fast path is decided).  It asks the job's standby
(:mod:`.protocol`) to fork the worker; when there is no standby, it does not
answer within ``HVD_ELASTIC_STANDBY_TIMEOUT`` seconds (default 0.5), it runs
other code (its fingerprint differs) or another interpreter, or the command is
not one it can fork (``python [-u] SCRIPT|-m MODULE ...``), it prints one line
saying why and ``exec``\\ s the command itself, exactly as horovodrun would have.

Contract with horovodrun, through the standby:

* SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 reach the worker's process group,
  also those that come after the run request and before the worker's pid (the
  worker may run already); when no worker starts after all, this process dies
  of them instead of starting the command itself;
* this process exits with the worker's exit code, or dies of the worker's signal;
* if this process is killed, the standby terminates the worker (the socket closes);
* if the standby dies while the worker runs, the worker's status is lost: this
  process terminates the worker and exits 1, saying so (Horovod then treats it
  as a failed worker, as it would a lost host).

Exit codes of its own: 2 for bad usage, 127 when the command cannot be run.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys

from hvd_elastic.envvars import DURATION, parse_seconds
from hvd_elastic.standby import protocol

TIMEOUT_ENV = "HVD_ELASTIC_STANDBY_TIMEOUT"
DEFAULT_TIMEOUT = 0.5  # seconds for the standby's hello: it answers from a select loop in milliseconds
FORK_TIMEOUT = 5.0  # seconds from the request to the worker's pid
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
PROG = "hvd-elastic exec"
USAGE = f"usage: {PROG} [--standby NAME] -- COMMAND [ARG ...]"
HELP = f"""{USAGE}

Run a worker command, forked from this host's warm standby when one is ready
(hvd-elastic standby), else run it directly.  Use it as horovodrun's command:

  horovodrun ... hvd-elastic exec -- python train.py --epochs 10

  --standby NAME   the job's standby (env {protocol.NAME_ENV}; default {protocol.DEFAULT_NAME})

Environment: {TIMEOUT_ENV} seconds to wait for the standby (default {DEFAULT_TIMEOUT}),
{protocol.DIR_ENV} its socket directory."""


class Fallback(Exception):
    """Why the command runs directly instead of through the standby."""


def parse(argv: list[str]) -> tuple[str, list[str]]:
    """(standby name, command); raises SystemExit(2) with one line for bad usage."""
    name = os.environ.get(protocol.NAME_ENV) or protocol.DEFAULT_NAME
    args = list(argv)
    while args and args[0] != "--":
        opt = args.pop(0)
        if opt in ("-h", "--help"):
            print(HELP)
            raise SystemExit(0)
        if opt == "--standby" and args:
            name = args.pop(0)
        elif opt.startswith("--standby="):
            name = opt.split("=", 1)[1]
        else:
            _usage_error(f"unknown option {opt!r} (the command goes after --)")
    if not args or args[0] != "--" or len(args) < 2:
        _usage_error("no command: put it after --")
    if not protocol.valid_name(name):
        _usage_error(f"standby name {name!r} is not {protocol.NAME_RULE}")
    return name, args[1:]


def _usage_error(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def python_request(command: list[str], standby_python: str) -> dict:
    """The run request for ``command`` if the standby's interpreter can run it; else Fallback."""
    interpreter = shutil.which(command[0])
    if interpreter is None or not _same_interpreter(interpreter, standby_python):
        raise Fallback(f"{command[0]} is not the standby's interpreter {standby_python}")
    unbuffered = False
    rest = command[1:]
    while rest and rest[0].startswith("-") and rest[0] != "-m":
        if rest[0] != "-u":
            raise Fallback(f"the standby does not take the interpreter option {rest[0]}")
        unbuffered = True
        rest = rest[1:]
    if not rest or rest[0] == "-" or (rest[0] == "-m" and len(rest) < 2):
        raise Fallback("no script or module to run")
    return {"argv": rest, "env": dict(os.environ), "cwd": os.getcwd(), "unbuffered": unbuffered}


def _same_interpreter(path: str, standby_python: str) -> bool:
    # A venv's bin/python is a symlink to the base interpreter: the same file, but
    # another sys.prefix.  So the directory must match too, not just the real file.
    path = os.path.abspath(path)
    return path == standby_python or (
        os.path.dirname(path) == os.path.dirname(standby_python)
        and os.path.realpath(path) == os.path.realpath(standby_python))


def through_standby(name: str, command: list[str]) -> int:
    """Run ``command`` in a worker forked by the standby; its exit code (or this process dies of its signal)."""
    try:
        path = protocol.socket_path(name)
    except ValueError as exc:
        raise Fallback(str(exc)) from None
    try:
        sock, hello = protocol.connect(name, _timeout())
    except FileNotFoundError:
        raise Fallback(f"no standby {name!r} on this host ({path})") from None
    except (OSError, protocol.ProtocolError) as exc:  # refused, timed out, reset
        raise Fallback(f"standby {name!r} did not answer ({_describe(exc)})") from None
    try:
        why = protocol.unusable(hello)
        if why is not None or hello is None:  # unusable() refuses a standby that sent no hello
            raise Fallback(f"standby {name!r} {why}")
        request = python_request(command, str(hello.get("python", "")))
        sock.settimeout(FORK_TIMEOUT)
        # From the request on: the worker may run (and be signalled by whoever started us) before its pid is here.
        signals = _Signals()
        try:
            protocol.send(sock, {"run": request}, [0, 1, 2])
            reply, _ = protocol.receive(sock)
        except (OSError, protocol.ProtocolError) as exc:
            signals.give_up()
            raise Fallback(f"standby {name!r} did not start the worker ({_describe(exc)})") from None
        if reply is None or "pid" not in reply:
            signals.give_up()
            raise Fallback(f"standby {name!r} refused: {(reply or {}).get('refused', 'connection closed')}")
        signals.relay_to(int(reply["pid"]))
        return _relay(sock, signals, name)
    finally:
        sock.close()


class _Signals:
    """The forwarded signals (:data:`FORWARDED`), caught from before the run request on.

    Until the worker's pid is known they are held; :meth:`relay_to` sends the
    held ones to the worker's process group and every later one as it comes.
    :meth:`give_up` (no worker after all) restores the defaults and delivers
    the held ones to this process, which then dies of them as it would have.
    """

    def __init__(self) -> None:
        self.pid: int | None = None
        self.held: list[int] = []
        for signum in FORWARDED:
            signal.signal(signum, self._caught)

    def _caught(self, signum, _frame) -> None:
        if self.pid is None:
            self.held.append(signum)
        else:
            self.send(signum)

    def send(self, signum: int) -> None:
        if self.pid is None:
            return  # never here: _caught holds a signal until relay_to has set the pid
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            pass

    def relay_to(self, pid: int) -> None:
        self.pid = pid
        while self.held:
            self.send(self.held.pop(0))

    def give_up(self) -> None:
        for forwarded in FORWARDED:
            signal.signal(forwarded, signal.SIG_DFL)
        for signum in self.held:
            os.kill(os.getpid(), signum)


def _relay(sock: socket.socket, signals: _Signals, name: str) -> int:
    sock.settimeout(None)
    try:
        message, _ = protocol.receive(sock)
    except (OSError, protocol.ProtocolError) as exc:
        message = None
        print(f"{PROG}: lost standby {name!r} ({_describe(exc)})", file=sys.stderr)
    if message is None or not ({"exit", "signal"} & message.keys()):
        signals.send(signal.SIGTERM)
        print(f"{PROG}: standby {name!r} went away while worker {signals.pid} ran: its exit status is lost, "
              f"worker terminated", file=sys.stderr)
        return 1
    if "signal" in message:
        signum = int(message["signal"])
        if signum not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(signum, signal.SIG_DFL)
        sys.stdout.flush()
        os.kill(os.getpid(), signum)
        return 128 + signum  # a signal that does not kill (SIGCHLD, say)
    return int(message["exit"])


def _timeout() -> float:
    text = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = parse_seconds(text) if text else DEFAULT_TIMEOUT
    except ValueError:
        value = -1.0
    if not 0 < value <= 60:
        _usage_error(f"{TIMEOUT_ENV}={text!r} is not a duration in (0, 60s] ({DURATION})")
    return value


def _describe(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout):
        return "timed out"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def run_directly(command: list[str]) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"{PROG}: error: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127


def add_arguments(parser) -> None:
    """For ``hvd-elastic --log-level ... exec`` through the full CLI; ``hvd-elastic exec`` itself skips argparse."""
    parser.description = HELP.split("\n\n", 1)[1]
    parser.add_argument("--standby", metavar="NAME", help=f"the job's standby (env {protocol.NAME_ENV})")
    parser.add_argument("command", nargs="...", help="-- then the worker command")


def run(args) -> int:
    return main([*(["--standby", args.standby] if args.standby else []), *args.command])


def main(argv: list[str] | None = None) -> int:
    name, command = parse(sys.argv[1:] if argv is None else argv)
    try:
        return through_standby(name, command)
    except Fallback as why:
        print(f"{PROG}: {why}; starting {command[0]} directly", file=sys.stderr, flush=True)
    return run_directly(command)
