"""Several real hosts on one machine: network namespaces with their own sshd and host name.

:class:`NetnsBed` builds, as root, ``hosts`` test hosts plus one launcher host:

* each host is a network namespace with one veth link to a bridge the bed owns,
  an address in a private /24 that no interface of this machine uses, a host
  name of its own (a UTS namespace held by its sshd) that resolves in every
  namespace through a marked block in ``/etc/hosts``, and its own ``sshd``
  listening on its address only;
* the launcher host runs horovodrun: every test host's address is foreign to
  it, so horovodrun reaches each one with REAL ssh, through an ``ssh`` wrapper
  first on ``PATH`` that adds the bed's client config (key pair made for the
  bed, no known_hosts written anywhere, keep-alives so a dead link is noticed);
* the root namespace keeps the bridge address, where the Consul dev agent
  listens so that every host reaches it.

The filesystem and the PID space are shared, so the project's ``.venv`` runs on
every host and the bed sees (and signals) every host's processes.  Each host's
sshd (and so every ssh session and worker on it) also has a mount namespace of
its own (``ip netns exec`` makes one, mounts do not propagate out of it), so
:meth:`NetnsBed.host_local_dir` can give a path a different, host-local
directory on each host, as node-local disks are.

Faults are one call each: :meth:`NetnsBed.crash` (SIGKILL every process of a
host but its sshd), :meth:`freeze`/:meth:`thaw` (SIGSTOP/SIGCONT: a hung host),
:meth:`partition`/:meth:`heal` (the host's link down/up), :meth:`add_host`
(a new host mid-run).  Teardown (context manager, also on errors and on
KeyboardInterrupt) kills every process in the bed's namespaces, deletes the
namespaces, links and bridge and removes the ``/etc/hosts`` block; a bed left
behind by a killed run is swept on the next setup.  One bed runs at a time on a
machine (a lock file), so names stay fixed and readable: ``hvdtb1``, ``hvdtb2``...

Safety: host names are the bed's own constants, never user text, and every
command runs from an argument list (no shell).  Traffic goes only to the bed's
own subnet.  :func:`unavailable_reason` says why a machine cannot run the bed
(not root, no ``ip netns``, no sshd), so tests can skip with that reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import ipaddress
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

PREFIX = "hvdtb"  # namespaces, links, bridge and host names all start with it
LAUNCHER = f"{PREFIX}0"
SSHD = "/usr/sbin/sshd"
HOSTS_FILE = Path("/etc/hosts")
LOCK_FILE = Path("/run/hvd-elastic-testbed.lock")
_BEGIN, _END = f"# BEGIN {PREFIX} (hvd-elastic test bed)", f"# END {PREFIX}"
_BRIDGE = f"{PREFIX}br"
# Candidate subnets, first one unused on this machine wins.  A /24 a user is unlikely to route.
_SUBNETS = [f"10.{second}.{third}.0/24" for second in (213, 231) for third in (17, 71, 117)]


def unavailable_reason() -> str | None:
    """Why this machine cannot run the bed, or None when it can."""
    if os.geteuid() != 0:
        return "the network-namespace test bed needs root (ip netns, veth, sshd)"
    for tool in ("ip", "nsenter", "unshare", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"the network-namespace test bed needs {tool!r} on PATH"
    if not os.access(SSHD, os.X_OK):
        return f"the network-namespace test bed needs {SSHD} (Debian openssh-server; scripts/bootstrap.sh installs it)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"'ip netns' does not work here: {probe.stderr.strip()}"
    return None


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


@dataclasses.dataclass
class Host:
    """One test host: its name (also its namespace and its entry in /etc/hosts), address and sshd."""

    name: str
    address: str
    link: str  # the root-namespace end of its veth pair
    sshd: subprocess.Popen | None = None

    @property
    def netns(self) -> str:
        return self.name

    def enter(self, mount: bool = False) -> list[str]:
        """Command prefix that runs a program on this host (its network and UTS namespaces; with ``mount``, also
        its mount namespace, where :meth:`NetnsBed.host_local_dir` directories are the host's own)."""
        return ["nsenter", f"--target={self.sshd.pid}", "--net", "--uts", *(["--mount"] if mount else []), "--"]


class NetnsBed:
    """``hosts`` test hosts and a launcher in network namespaces; see the module docstring."""

    def __init__(self, workdir: Path, hosts: int = 3, *, ssh_keepalive: bool = True):
        if hosts < 1:
            raise ValueError(f"hosts must be >= 1, got {hosts}")
        self.workdir = Path(workdir)
        self.ssh_keepalive = ssh_keepalive  # False: OpenSSH's default client settings, as most users run
        self._initial = hosts
        self.hosts: dict[str, Host] = {}
        self.launcher: Host | None = None
        self.bridge_address = ""
        self._network: ipaddress.IPv4Network | None = None
        self._lock = None

    # -- set-up and tear-down ------------------------------------------------

    def __enter__(self) -> "NetnsBed":
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._lock = open(LOCK_FILE, "w")
        fcntl.flock(self._lock, fcntl.LOCK_EX)  # one bed per machine; released by close()
        try:
            sweep()
            self._make_keys()
            self._network = ipaddress.ip_network(_free_subnet())
            self.bridge_address = str(self._network.network_address + 1)
            _run("ip", "link", "add", _BRIDGE, "type", "bridge")
            _run("ip", "addr", "add", f"{self.bridge_address}/24", "dev", _BRIDGE)
            _run("ip", "link", "set", _BRIDGE, "up")
            self.launcher = self._make_host(0)
            for i in range(1, self._initial + 1):
                self.add_host(i)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Tear everything down; safe to call twice and after a failed set-up."""
        try:
            sweep()
        finally:
            for host in [*self.hosts.values(), *([self.launcher] if self.launcher else [])]:
                if host.sshd is not None:
                    with contextlib.suppress(ProcessLookupError):
                        host.sshd.kill()
                    host.sshd.wait()
            self.hosts.clear()
            self.launcher = None
            if self._lock is not None:
                self._lock.close()
                self._lock = None

    def add_host(self, index: int | None = None) -> Host:
        """A new host joins the machine (its sshd answers when this returns); not yet in Consul."""
        index = index if index is not None else max((int(n[len(PREFIX):]) for n in self.hosts), default=0) + 1
        host = self._make_host(index)
        self.hosts[host.name] = host
        return host

    def _make_host(self, index: int) -> Host:
        name = f"{PREFIX}{index}"
        address = str(self._network.network_address + 10 + index)
        host = Host(name=name, address=address, link=f"{name}v")
        _run("ip", "netns", "add", name)
        _run("ip", "link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", name)
        _run("ip", "link", "set", host.link, "master", _BRIDGE)
        _run("ip", "link", "set", host.link, "up")
        for cmd in (["ip", "addr", "add", f"{address}/24", "dev", "eth0"], ["ip", "link", "set", "eth0", "up"],
                    ["ip", "link", "set", "lo", "up"]):
            _run("ip", "netns", "exec", name, *cmd)
        _add_hosts_entry(name, address)
        host.sshd = self._start_sshd(host)
        return host

    def _make_keys(self) -> None:
        keys = self.workdir / "ssh"
        keys.mkdir(exist_ok=True)
        for key in ("id_ed25519", "host_ed25519"):
            if not (keys / key).exists():
                _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{PREFIX}-{key}", "-f", str(keys / key))
        config = keys / "config"
        # Keep-alives (unless ssh_keepalive is off): a partitioned or frozen host's ssh session ends
        # after about 6 s, so horovodrun sees its workers fail instead of waiting on TCP for hours.
        config.write_text(
            "Host *\n"
            f"  IdentityFile {keys / 'id_ed25519'}\n"
            "  IdentitiesOnly yes\n  User root\n  BatchMode yes\n"
            "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
            "  ConnectTimeout 5\n"
            + ("  ServerAliveInterval 2\n  ServerAliveCountMax 3\n" if self.ssh_keepalive else "")
        )
        wrapper_dir = self.workdir / "bin"
        wrapper_dir.mkdir(exist_ok=True)
        wrapper = wrapper_dir / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F "{config}" "$@"\n')
        wrapper.chmod(0o755)

    def _start_sshd(self, host: Host) -> subprocess.Popen:
        keys = self.workdir / "ssh"
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
        log_file = open(self.workdir / f"sshd.{host.name}.log", "w")
        # unshare --uts gives the host its own host name; exec keeps the sshd pid = Popen pid,
        # which is the target every later nsenter enters.
        proc = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, "unshare", "--uts", "sh", "-c",
             'hostname "$0" && exec "$@"', host.name, SSHD, "-D", "-e", "-f", "/dev/null",
             "-o", f"ListenAddress={host.address}", "-o", f"HostKey={keys / 'host_ed25519'}",
             "-o", f"AuthorizedKeysFile={keys / 'id_ed25519.pub'}", "-o", "PidFile=none",
             "-o", "PermitRootLogin=prohibit-password", "-o", "StrictModes=no", "-o", "UsePAM=no",
             "-o", "UseDNS=no", "-o", "PrintMotd=no", "-o", "MaxStartups=100:30:200",
             "-o", "ClientAliveInterval=2", "-o", "ClientAliveCountMax=3",
             # bash sources ~/.bashrc for a command run by sshd only at shell level 1.  This machine's .bashrc
             # runs `pyenv rehash`, whose lock a host fault that SIGKILLs it leaves behind: every later session
             # then waits 60 s for it (seen in the 200-fault soak, and it failed every bed test after it).
             "-o", "SetEnv=SHLVL=1"],
            stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        log_file.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"sshd of {host.name} exited with {proc.returncode}: "
                                   f"{(self.workdir / f'sshd.{host.name}.log').read_text()[-2000:]}")
            probe = _run("ip", "netns", "exec", host.netns, "ssh", "-F", str(keys / "config"), host.name, "true",
                         check=False)
            if probe.returncode == 0:
                return proc
            time.sleep(0.2)
        proc.kill()
        raise RuntimeError(f"sshd of {host.name} did not accept a login within 20 s")

    # -- running things on hosts -------------------------------------------

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` with the bed's ssh wrapper first on PATH (for horovodrun on the launcher)."""
        return dict(base, PATH=f"{self.workdir / 'bin'}{os.pathsep}{base.get('PATH', '')}")

    def on(self, host: str | Host, cmd: Iterable[str], mount: bool = False) -> list[str]:
        """``cmd`` prefixed so that it runs on ``host`` (launcher included); ``mount``: see :meth:`Host.enter`."""
        return [*self._host(host).enter(mount), *map(str, cmd)]

    def run(self, host: str | Host, cmd: Iterable[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.on(host, cmd), capture_output=True, text=True, timeout=timeout, **kwargs)

    def host_local_dir(self, host: str | Host, path: Path) -> None:
        """Make ``path`` a directory of ``host``'s own: an empty tmpfs over it in the host's mount namespace.

        What runs over ssh on ``host`` (its workers) sees the tmpfs; every other host, the
        launcher's ssh-less commands (:meth:`run`, :meth:`on` without ``mount``) and this process see ``path``
        as it is.  The mount goes with the host's namespace at teardown.
        """
        target = self._host(host)
        Path(path).mkdir(parents=True, exist_ok=True)
        _run("nsenter", f"--target={target.sshd.pid}", "--mount", "--", "mount", "-t", "tmpfs", "-o", "size=64m",
             f"{PREFIX}-local", str(path))

    def processes(self, host: str | Host, match: str | None = None) -> list[psutil.Process]:
        """Live processes of ``host`` other than its sshd listener; ``match``: a substring of the command line."""
        target = self._host(host)
        listed = _run("ip", "netns", "pids", target.netns, check=False).stdout.split()
        procs = []
        for pid in map(int, listed):
            if pid == target.sshd.pid:
                continue
            with contextlib.suppress(psutil.NoSuchProcess):
                proc = psutil.Process(pid)
                if match is None or match in " ".join(proc.cmdline()):
                    procs.append(proc)
        return procs

    # -- faults ------------------------------------------------------------

    def signal(self, host: str | Host, sig: int, match: str | None = None) -> list[int]:
        """Send ``sig`` to the host's processes (those whose command line holds ``match``); their pids."""
        pids = []
        for proc in self.processes(host, match):
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(sig)
                pids.append(proc.pid)
        return pids

    def crash(self, host: str | Host, match: str | None = None) -> list[int]:
        """SIGKILL every process of the host (its node agent too) but its sshd: the host died."""
        return self.signal(host, signal.SIGKILL, match)

    def freeze(self, host: str | Host) -> list[int]:
        """SIGSTOP every process of the host, its sshd included: a hung host that still holds its sockets."""
        target = self._host(host)
        os.kill(target.sshd.pid, signal.SIGSTOP)
        return [target.sshd.pid, *self.signal(target, signal.SIGSTOP)]

    def thaw(self, host: str | Host) -> None:
        target = self._host(host)
        self.signal(target, signal.SIGCONT)
        os.kill(target.sshd.pid, signal.SIGCONT)

    def partition(self, host: str | Host) -> None:
        """Cut the host's link: nothing reaches it and it reaches nothing, its processes keep running."""
        _run("ip", "link", "set", self._host(host).link, "down")

    def heal(self, host: str | Host) -> None:
        _run("ip", "link", "set", self._host(host).link, "up")

    def _host(self, host: str | Host) -> Host:
        if isinstance(host, Host):
            return host
        if self.launcher is not None and host == self.launcher.name:
            return self.launcher
        try:
            return self.hosts[host]
        except KeyError:
            raise KeyError(f"unknown test host {host!r} (known: {', '.join(self.hosts)})") from None


# -- machine-wide state the bed owns -------------------------------------------


def _free_subnet() -> str:
    used = [ipaddress.ip_interface(a).network for a in _run("ip", "-o", "-4", "addr", "show").stdout.split()
            if "/" in a and a[0].isdigit()]
    routes = _run("ip", "-4", "route", "show").stdout
    for candidate in _SUBNETS:
        network = ipaddress.ip_network(candidate)
        if not any(network.overlaps(u) for u in used) and candidate.split("/")[0][:-1] not in routes:
            return candidate
    raise RuntimeError(f"every candidate test subnet is in use on this machine: {', '.join(_SUBNETS)}")


def _add_hosts_entry(name: str, address: str) -> None:
    lines = HOSTS_FILE.read_text().splitlines()
    if _BEGIN not in lines:
        lines += [_BEGIN, _END]
    end = lines.index(_END)
    lines[end:end] = [f"{address} {name}"]
    _write_hosts(lines)


def _write_hosts(lines: list[str]) -> None:
    # /etc/hosts may be a bind mount (containers): rewrite it in place, never rename over it.
    with open(HOSTS_FILE, "r+") as f:
        f.seek(0)
        f.write("\n".join(lines) + "\n")
        f.truncate()


def sweep() -> None:
    """Remove every trace of a bed: processes in its namespaces, namespaces, links, /etc/hosts block.

    Runs at set-up too (under the machine-wide lock), so a run killed before its
    tear-down never breaks the next one.
    """
    names = [line.split()[0] for line in _run("ip", "netns", "list").stdout.splitlines()
             if line.startswith(PREFIX)]
    for name in names:
        for pid in _run("ip", "netns", "pids", name, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    for name in names:
        _run("ip", "netns", "delete", name, check=False)
    links = [line.split(":")[1].strip().split("@")[0] for line in _run("ip", "-o", "link", "show").stdout.splitlines()]
    for link in links:
        if link.startswith(PREFIX):
            _run("ip", "link", "delete", link, check=False)
    lines = HOSTS_FILE.read_text().splitlines()
    if _BEGIN in lines:
        begin, end = lines.index(_BEGIN), lines.index(_END)
        _write_hosts(lines[:begin] + lines[end + 1:])
