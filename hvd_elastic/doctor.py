"""``hvd-elastic doctor``: check, one line each, what a training node needs.

Every check returns a :class:`Finding`.  A failed *required* check makes the
command exit 1 and its line says how to fix it; optional checks (GPUs on a
CPU-only node, say) only warn.

``--hosts h1,h2`` adds one ``shared`` line per host: doctor writes a marker
into ``--checkpoint-dir`` here (:mod:`hvd_elastic.training._internal.shared_dir`) and
reads it back on each host with ``ssh HOST cat -- MARKER`` (BatchMode, as
horovodrun reaches its hosts), then removes it.  A host that does not see it
fails: after a whole-job restart rank 0 may run there and would start over
from nothing.  Host names are validated (:func:`hvd_elastic.options.host_list`)
before any reaches ssh; a bad one is a one-line error naming it, exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from hvd_elastic.consul import api
from hvd_elastic.consul.config import ConfigError, ConsulConfig, token_file_exposure
from hvd_elastic.consul.errors import ConsulError
from hvd_elastic.discovery import token_guard
from hvd_elastic.options import argument_type, host_list
from hvd_elastic.training._internal import shared_dir

BOOTSTRAP_FIX = "run scripts/bootstrap.sh"


@dataclasses.dataclass
class Finding:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True

    @property
    def label(self) -> str:
        if self.ok:
            return "ok"
        return "FAIL" if self.required else "warn"

    def line(self) -> str:
        text = f"{self.label:<5} {self.name:<10} {self.detail}"
        if not self.ok and self.fix:
            text += f" (fix: {self.fix})"
        return text


def check_python(args: argparse.Namespace) -> Finding:
    version = ".".join(map(str, sys.version_info[:3]))
    ok = sys.version_info >= (3, 10)
    return Finding("python", ok, f"{version} at {sys.executable}", "use Python 3.10 or newer")


def _version_of(module: str) -> str | None:
    try:
        return importlib.import_module(module).__version__
    except Exception:  # an import that crashes is as missing as one that is absent
        return None


def check_torch(args: argparse.Namespace) -> Finding:
    version = _version_of("torch")
    if version is None:
        return Finding("torch", False, "not importable", BOOTSTRAP_FIX)
    return Finding("torch", True, version)


def parse_check_build(text: str) -> dict[str, dict[str, bool]]:
    """Parse ``horovodrun --check-build`` into {section: {item: ticked}}."""
    sections: dict[str, dict[str, bool]] = {}
    current: dict[str, bool] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.endswith(":") and not line.startswith("["):
            current = sections.setdefault(line[:-1], {})
        elif current is not None and line[:3] in ("[X]", "[ ]"):
            current[line[3:].strip()] = line[:3] == "[X]"
    return sections


def check_horovod(args: argparse.Namespace) -> Finding:
    horovodrun = shutil.which("horovodrun",
                              path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if horovodrun is None:
        return Finding("horovod", False, "horovodrun not found", BOOTSTRAP_FIX)
    try:
        out = subprocess.run([horovodrun, "--check-build"], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return Finding("horovod", False, "horovodrun --check-build timed out", BOOTSTRAP_FIX)
    build = parse_check_build(out.stdout)
    ticked = {
        "PyTorch": build.get("Available Frameworks", {}).get("PyTorch", False),
        "Gloo": build.get("Available Controllers", {}).get("Gloo", False),
        "MPI": build.get("Available Controllers", {}).get("MPI", False),
    }
    version = _version_of("horovod") or "?"
    detail = f"{version}: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in ticked.items())
    return Finding("horovod", out.returncode == 0 and all(ticked.values()), detail,
                   "rebuild Horovod with PyTorch, Gloo and MPI: " + BOOTSTRAP_FIX)


def check_mpi(args: argparse.Namespace) -> Finding:
    try:
        from mpi4py import MPI
    except Exception as exc:
        return Finding("mpi", False, f"mpi4py not importable ({exc.__class__.__name__})", BOOTSTRAP_FIX)
    # Open MPI ends the string with a NUL, which would make the report binary to grep.
    library = MPI.Get_library_version().replace("\x00", "").splitlines()[0].strip()
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        return Finding("mpi", False, f"mpi4py on {library}, but no mpirun", "apt-get install openmpi-bin")
    return Finding("mpi", True, f"mpi4py on {library}; mpirun {mpirun}")


def check_consul(args: argparse.Namespace) -> Finding:
    fix = "start the local Consul agent or point CONSUL_HTTP_ADDR at it"
    try:
        cfg = ConsulConfig.from_env()
    except ConfigError as exc:
        return Finding("consul", False, str(exc), "fix the CONSUL_HTTP_* variable")
    try:
        leader = api.leader(cfg, timeout=args.timeout)
    except ConfigError as exc:
        return Finding("consul", False, str(exc), "fix the CONSUL_CACERT / CONSUL_CLIENT_* files")
    except ConsulError as exc:
        return Finding("consul", False, str(exc), fix if exc.status is None else "")
    if not leader:
        return Finding("consul", False, f"{cfg.base_url} reports no cluster leader",
                       "wait for the Consul cluster to elect a leader")
    return Finding("consul", True, f"{cfg.base_url} leader {leader}")


def check_token(args: argparse.Namespace) -> Finding:
    """The token check discovery makes under horovodrun (:mod:`hvd_elastic.discovery.token_guard`),
    and the token file's mode.
    """
    try:
        accepted = token_guard.allowed(os.environ)
    except ConfigError as exc:
        return Finding("token", False, str(exc), f"set {token_guard.ALLOW_ENV}=1 or unset it")
    found = token_guard.exposure(os.environ, token_flag=False)
    if found is not None:
        risk, fix = found
        allow = f"{token_guard.ALLOW_ENV}=1"
        detail = f"{risk}; under horovodrun discovery " + (f"runs anyway ({allow})" if accepted
                                                           else f"refuses to run unless {allow}")
        return Finding("token", False, detail, fix, required=not accepted)
    path = os.environ.get("CONSUL_HTTP_TOKEN_FILE")
    if not path:
        return Finding("token", True, "no Consul ACL token set")
    exposed = token_file_exposure(path)
    if exposed:
        return Finding("token", False, f"CONSUL_HTTP_TOKEN_FILE={path!r} {exposed}", required=False)
    return Finding("token", True, f"CONSUL_HTTP_TOKEN_FILE={path!r}, readable by its owner only")


def check_gpus(args: argparse.Namespace) -> Finding:
    # The same detection the node agent advertises its slots from.
    from hvd_elastic.nodeagent.probes import query_gpus

    gpus = query_gpus()
    if gpus.count:
        return Finding("gpus", True, f"{gpus.count} visible ({gpus.model}, {gpus.memory_mib} MiB)")
    return Finding("gpus", False, "0 visible; node-agent would advertise --cpu-slots (default 1)",
                   "check the NVIDIA driver, nvidia-smi and CUDA_VISIBLE_DEVICES", required=args.require_gpu)


def check_disk(args: argparse.Namespace) -> Finding:
    path = args.checkpoint_dir
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(os.path.abspath(probe))
    free_gib = shutil.disk_usage(probe).free / 2**30
    ok = free_gib >= args.min_free_gib
    return Finding("disk", ok, f"{free_gib:.1f} GiB free at {path} (need {args.min_free_gib:g})",
                   "free space or choose another --checkpoint-dir")


SSH_CONNECT_TIMEOUT = 10  # seconds; ssh's own limit on reaching a host
SSH_TIMEOUT = 30  # seconds for the whole remote read
SHARED_FIX = (f"mount the same shared file system at --checkpoint-dir on every host, or, if it is local on "
              f"purpose, set {shared_dir.LOCAL_ENV}=1 for the job")


def check_shared_dir(args: argparse.Namespace) -> list[Finding]:
    """One ``shared`` finding per host of ``--hosts``: does it see the marker written here (none without --hosts)."""
    if not args.hosts:
        return []
    directory = os.path.abspath(args.checkpoint_dir)
    try:
        marker = shared_dir.write_marker(directory)
    except OSError as exc:
        return [Finding("shared", False, f"cannot write a marker into {directory} ({exc.strerror or exc})",
                        "create the directory, writable by the job's user, or choose another --checkpoint-dir")]
    try:
        with ThreadPoolExecutor(max_workers=min(16, len(args.hosts))) as pool:
            return list(pool.map(lambda host: _probe_marker(host, directory, marker), args.hosts))
    finally:
        marker.remove()


def _probe_marker(host: str, directory: str, marker: shared_dir.Marker) -> Finding:
    # host passed host_list's validation; the path is quoted for the remote shell ssh hands it to.
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT}", "--", host,
           f"cat -- {shlex.quote(str(marker.path))}"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=SSH_TIMEOUT, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return Finding("shared", False, f"{host}: no ssh client here", "apt-get install openssh-client")
    except subprocess.TimeoutExpired:
        return Finding("shared", False, f"{host}: ssh did not answer within {SSH_TIMEOUT} s",
                       "check that this host reaches it with ssh, as horovodrun must")
    said = " ".join(out.stderr.split())[-300:]
    if out.returncode == 255:  # ssh's own failure, not the remote command's
        return Finding("shared", False, f"{host}: ssh failed ({said or 'exit 255'})",
                       "check that this host reaches it with ssh in BatchMode, as horovodrun must")
    if out.returncode == 0 and out.stdout == marker.nonce:
        return Finding("shared", True, f"{host} sees {directory}")
    why = said or ("a different file under the marker's name" if out.returncode == 0 else f"exit {out.returncode}")
    return Finding("shared", False, f"{host} does not see {directory}: the marker written here is not there ({why})",
                   SHARED_FIX)


def check_ssh(args: argparse.Namespace) -> Finding:
    """The launcher's ssh keep-alives (``ssh -G HOST``: the settings horovodrun's ssh would use)."""
    host = args.hosts[0] if args.hosts else "localhost"  # validated by host_list
    if shutil.which("ssh") is None:
        return Finding("ssh", False, "no ssh client here", "apt-get install openssh-client", required=False)
    try:
        out = subprocess.run(["ssh", "-G", "--", host], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return Finding("ssh", False, f"ssh -G {host} timed out", required=False)
    settings = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    interval = settings.get("serveraliveinterval", "0")
    count = settings.get("serveralivecountmax", "3")
    if out.returncode != 0 or not interval.isdigit() or not count.isdigit():
        return Finding("ssh", False, f"cannot read ssh's settings for {host}: {out.stderr.strip() or 'no output'}",
                       required=False)
    if int(interval) == 0:
        return Finding("ssh", False, f"no keep-alives to {host} (ServerAliveInterval 0): horovodrun notices a host "
                       "that froze or dropped off the network only when its Consul check fails (discovery's "
                       "watcher then ends the session) or when TCP gives up",
                       "add 'ServerAliveInterval 5' to the launcher's ~/.ssh/config", required=False)
    return Finding("ssh", True, f"keep-alives to {host}: a lost host's session ends after about "
                   f"{int(interval) * int(count)} s (ServerAliveInterval {interval} x ServerAliveCountMax {count})")


CHECKS: list[Callable[[argparse.Namespace], Finding]] = [
    check_python, check_torch, check_horovod, check_mpi, check_consul, check_token, check_gpus, check_disk,
    check_ssh,
]


_non_negative = argument_type(float, lambda v: 0 <= v < float("inf"), "a number >= 0")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint-dir", default=os.environ.get("HVD_ELASTIC_CHECKPOINT_DIR", "."),
                        help="where checkpoints will be written (env HVD_ELASTIC_CHECKPOINT_DIR; default: .)")
    parser.add_argument("--min-free-gib", type=_non_negative, default=1.0,
                        help="free disk required at --checkpoint-dir, in GiB (default %(default)s)")
    parser.add_argument("--require-gpu", action="store_true", help="fail, not warn, when no GPU is visible")
    parser.add_argument("--hosts", type=host_list, metavar="H1,H2,...", default=[],
                        help="also check over ssh that each of these hosts sees --checkpoint-dir "
                             "(the same shared directory), one 'shared' line per host")
    parser.add_argument("--timeout", type=_non_negative, default=2.0,
                        help="seconds to wait for the Consul agent (default %(default)s)")
    parser.epilog = ("Consul is reached through CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN_FILE and the other "
                     "CONSUL_HTTP_* variables.")


def run(args: argparse.Namespace) -> int:
    findings = [check(args) for check in CHECKS] + check_shared_dir(args)
    for finding in findings:
        print(finding.line(), flush=True)
    failed = [f.name for f in findings if not f.ok and f.required]
    if failed:
        # One name per kind of check: --hosts makes a "shared" line per host.
        print(f"doctor: {len(failed)} required check(s) failed: {', '.join(dict.fromkeys(failed))}", file=sys.stderr)
        return 1
    return 0
