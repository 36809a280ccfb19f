"""Discovery's host cache under test (tests/discovery and the discovery benchmarks): a stand-in horovodrun, a
counting proxy, cache files.

* :class:`StandInJob` is a process that runs discovery calls the way
  horovodrun does (each in a new session, so the call's job is this process);
  killing it is "horovodrun went away".
* :class:`CountingProxy` sits between discovery and the dev agent on loopback
  and records every request line with the bytes sent back: how many full
  health answers Consul served, and which were blocking reads.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from hvd_elastic.discovery import cache

from .env import CONSUL_HOSTS, HVD_ELASTIC
from .procs import pid_alive

_JOB = r"""
import json, subprocess, sys
for line in sys.stdin:
    cmd = json.loads(line)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, start_new_session=True)
        out = [r.returncode, r.stdout, r.stderr]
    except subprocess.TimeoutExpired:
        out = [-1, "", "timed out"]
    print(json.dumps(out), flush=True)
"""


class StandInJob:
    """A parent process that stands in for horovodrun: discovery calls it runs belong to its job."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.proc = subprocess.Popen([sys.executable, "-c", _JOB], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env, start_new_session=True)

    def discover(self, *args: str, cli: bool = False) -> subprocess.CompletedProcess:
        cmd = [str(HVD_ELASTIC), "discover", *args] if cli else [str(CONSUL_HOSTS), *args]
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()  # the child's own 60 s timeout bounds this
        if not line:
            raise AssertionError("the stand-in job died")
        code, out, err = json.loads(line)
        return subprocess.CompletedProcess(cmd, code, out, err)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def __enter__(self) -> "StandInJob":
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


def cache_files(state_dir: Path) -> list[Path]:
    """The host cache files (not their lock, log or temp files) under a discovery state directory."""
    return sorted(p for p in state_dir.glob("*/hosts-*")
                  if p.suffix not in (".lock", ".log", ".tmp") and ".tmp" not in p.name)


def read_record(path: Path) -> cache.Record | None:
    """The record in a cache file, or None when it is missing or unreadable right now."""
    try:
        return cache.parse(path.read_bytes())
    except (OSError, cache.CacheInvalid):
        return None


def fresh_record(state_dir: Path) -> cache.Record | None:
    """The single cache file's record when its watcher vouches for it, else None."""
    files = cache_files(state_dir)
    if len(files) != 1:
        return None
    rec = read_record(files[0])
    return rec if rec is not None and cache.untrusted_reason(rec) is None else None


def kill_watchers(state_dir: Path) -> None:
    """SIGKILL every watcher that wrote a cache file under ``state_dir`` (test teardown)."""
    for path in cache_files(state_dir):
        rec = read_record(path)
        if rec is not None and pid_alive(rec.pid):
            try:
                os.kill(rec.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class CountingProxy:
    """Loopback TCP proxy to ``upstream`` (host:port) recording ``[request line, bytes back]`` per connection."""

    def __init__(self, upstream: str):
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.requests: list[list] = []
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(256)
        self.addr = f"127.0.0.1:{self._sock.getsockname()[1]}"
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> "CountingProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._closed.set()
        self._sock.close()

    def health(self, blocking: bool | None = None) -> list[list]:
        """The health-service requests seen (blocking ones carry ``index=``), with their bytes back."""
        with self._lock:
            rows = [r for r in self.requests if " /v1/health/service/" in r[0]]
        if blocking is None:
            return rows
        return [r for r in rows if ("index=" in r[0]) == blocking]

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        row = ["", 0]
        try:
            upstream = socket.create_connection(self.upstream, timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        with self._lock:
            self.requests.append(row)

        def up() -> None:
            head = b""
            try:
                while True:
                    data = client.recv(1 << 16)
                    if not data:
                        break
                    if not row[0]:
                        head += data
                        if b"\r\n" in head:
                            row[0] = head.split(b"\r\n", 1)[0].decode("latin-1")
                    upstream.sendall(data)
            except OSError:
                pass
            finally:
                try:
                    upstream.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

        pump = threading.Thread(target=up, daemon=True)
        pump.start()
        try:
            while True:
                data = upstream.recv(1 << 16)
                if not data:
                    break
                row[1] += len(data)
                client.sendall(data)
        except OSError:
            pass
        finally:
            upstream.close()
            client.close()
