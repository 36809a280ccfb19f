"""``hvd-elastic doctor``: check, one line each, what a training node needs.

Every check returns a :class:`Finding`, printed as soon as it is made (on a
terminal, the check under way shows meanwhile: importing torch and
``horovodrun --check-build`` take seconds).  A failed *required* check makes
the command exit 1, or 2 when what failed is a setting (a bad
``--http-addr``/``CONSUL_HTTP_ADDR``, an unreadable token file), and its line
says how to fix it; optional checks (GPUs, CUDA and NCCL on a CPU-only node,
say; required with ``--require-gpu``) only warn.  Consul is reached with the
same flags and ``CONSUL_*`` variables as every other command.

``--launcher torchrun`` checks a node for ``torchrun --rdzv-backend consul`` instead of horovodrun (no
Horovod, MPI or ssh lines): that torchrun finds the ``consul`` backend (``torchrun``), that the token may
write and delete keys under the rendezvous key prefix (``rdzv``: a probe key, removed again), with
``--rdzv-id`` that the run id is not closed by an earlier job (``run``: torchrun would refuse to join it),
and what the health gate decides for this node (``gate``: its node agent's instance passing, not drained).
``--rdzv-endpoint`` and ``--rdzv-conf`` take torchrun's values; the agent reads its token and TLS settings
from the ``CONSUL_HTTP_*`` variables, which doctor reads too.

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
import pickle
import secrets
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from hvd_elastic.consul import api
from hvd_elastic.consul.config import ConfigError, ConsulConfig, read_token_file, token_file_exposure
from hvd_elastic.consul.errors import ConsulError
from hvd_elastic.discovery import token_guard
from hvd_elastic.options import (
    add_consul_arguments,
    argument_type,
    command_name,
    consul_config,
    env,
    fail,
    host_list,
    positive_seconds,
    setting,
)
from hvd_elastic.torchrun.settings import RendezvousSettings
from hvd_elastic.training._internal import shared_dir

def install_fix(package_dir: str) -> str:
    """How to (re)install what is missing for the hvd_elastic in ``package_dir``: a checkout's bootstrap script,
    or pip for an installed package (which has no scripts/)."""
    if os.path.isfile(os.path.join(os.path.dirname(package_dir), "scripts", "bootstrap.sh")):
        return "run scripts/bootstrap.sh"
    return ("install torch, then HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 "
            "pip install --no-cache-dir 'horovod[pytorch]==0.28.1' (HOROVOD_GPU_OPERATIONS=NCCL too on GPU nodes)")


BOOTSTRAP_FIX = install_fix(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass
class Finding:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True
    bad_input: bool = False  # failed on a bad setting (exit 2), not on the node itself (exit 1)

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
    nccl = build.get("Available Tensor Operations", {}).get("NCCL", False)
    needed = {**ticked, **({"NCCL": nccl} if args.require_gpu else {})}  # GPU nodes allreduce over NCCL
    version = _version_of("horovod") or "?"
    detail = (f"{version}: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in ticked.items())
              + f", NCCL {'yes' if nccl else 'no'}")
    return Finding("horovod", out.returncode == 0 and all(needed.values()), detail,
                   f"rebuild Horovod with {', '.join(needed)}: " + BOOTSTRAP_FIX)


def check_cuda(args: argparse.Namespace) -> Finding:
    """What torch itself sees of CUDA and NCCL (the GPU line counts what nvidia-smi sees)."""
    try:
        import torch
    except Exception:  # the torch line says why
        return Finding("cuda", False, "torch not importable", BOOTSTRAP_FIX, required=args.require_gpu)
    if not torch.version.cuda:
        return Finding("cuda", False, f"torch {torch.__version__} is a CPU-only build",
                       "install a CUDA build of torch (https://pytorch.org/get-started/locally/)",
                       required=args.require_gpu)
    if not torch.cuda.is_available():
        return Finding("cuda", False, f"torch built for CUDA {torch.version.cuda} sees no GPU",
                       "check the NVIDIA driver (nvidia-smi) and CUDA_VISIBLE_DEVICES", required=args.require_gpu)
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # a build without NCCL
        nccl = "none"
    return Finding("cuda", nccl != "none", f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s), "
                   f"NCCL {nccl}", "install a torch build with NCCL", required=args.require_gpu)


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


def doctor_consul(args: argparse.Namespace) -> ConsulConfig:
    """The Consul agent the job will use: torchrun's ``--rdzv-endpoint`` when given, else the common flags."""
    if args.launcher == "torchrun" and args.rdzv_endpoint:
        return consul_config(args, addr=args.rdzv_endpoint, addr_flag="--rdzv-endpoint")
    return consul_config(args)


def check_consul(args: argparse.Namespace) -> Finding:
    fix = "start the local Consul agent or point --http-addr or CONSUL_HTTP_ADDR at it"
    try:
        cfg = doctor_consul(args)
        leader = api.leader(cfg, timeout=args.timeout)
    except ConfigError as exc:
        return Finding("consul", False, str(exc), bad_input=True)
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
    # The exposure is horovodrun's: it puts the launcher's environment on each host's ssh command line.
    found = token_guard.exposure(os.environ, token_flag=bool(args.token)) if args.launcher == "horovodrun" else None
    if found is not None:
        risk, fix = found
        allow = f"{token_guard.ALLOW_ENV}=1"
        detail = f"{risk}; under horovodrun discovery " + (f"runs anyway ({allow})" if accepted
                                                           else f"refuses to run unless {allow}")
        return Finding("token", False, detail, fix, required=not accepted)
    source, path = (("--token-file", args.token_file) if args.token_file
                    else ("CONSUL_HTTP_TOKEN_FILE", os.environ.get("CONSUL_HTTP_TOKEN_FILE")))
    if not path:
        return Finding("token", True, "no Consul ACL token set")
    try:
        token = read_token_file(source, path, warn=False)
    except ConfigError as exc:
        return Finding("token", False, str(exc), "make it readable by the user that runs the job", bad_input=True)
    if not token:
        return Finding("token", False, f"{source}={path!r} is empty", "write the token into it", bad_input=True)
    exposed = token_file_exposure(path)
    if exposed:
        return Finding("token", False, f"{source}={path!r} {exposed}", required=False)
    return Finding("token", True, f"{source}={path!r}, readable by its owner only")


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
    where = f"{setting(args, 'checkpoint_dir', '--checkpoint-dir')}={path!r}"
    if not os.path.exists(path):
        return Finding("disk", False, f"{where} does not exist",
                       "create it (on the file system every host mounts) or choose another --checkpoint-dir")
    if not os.path.isdir(path):
        return Finding("disk", False, f"{where} is not a directory", "choose a directory as --checkpoint-dir")
    if not os.access(path, os.W_OK | os.X_OK):
        return Finding("disk", False, f"{where} is not writable by this user",
                       "make it writable by the user that runs the job")
    free_gib = shutil.disk_usage(path).free / 2**30
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


TORCHRUN_FIX = "pip install hvd-elastic into the Python that runs torchrun (its torchrun.handlers entry point)"
NODE_AGENT_FIX = "run hvd-elastic node-agent on every node (docs/howto/torchrun.md)"


def check_torchrun(args: argparse.Namespace) -> Finding:
    """torchrun finds our ``consul`` backend, and this torch has what the handler builds on."""
    from importlib.metadata import entry_points

    from hvd_elastic.torchrun.plugin import handler_creator

    ours = f"{handler_creator.__module__}:{handler_creator.__name__}"
    found = [point.value for point in entry_points(group="torchrun.handlers") if point.name == "consul"]
    if found != [ours]:
        detail = (f"torchrun.handlers names consul as {', '.join(found)}, not {ours}" if found
                  else "no 'consul' in the torchrun.handlers entry points")
        return Finding("torchrun", False, detail, TORCHRUN_FIX)
    try:
        from hvd_elastic.torchrun import handler  # noqa: F401 -- checks torch's private parts at import
    except ImportError as exc:
        return Finding("torchrun", False, str(exc).splitlines()[0], BOOTSTRAP_FIX)
    return Finding("torchrun", True, f"--rdzv-backend consul ({ours}) on torch {_version_of('torch')}")


def rendezvous_settings(args: argparse.Namespace) -> RendezvousSettings:
    """What ``torchrun --rdzv-backend consul`` with these values would read; raises ConfigError."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    params = RendezvousParameters("consul", args.rdzv_endpoint or "", args.rdzv_id or "doctor", 1, 1,
                                  **args.rdzv_conf)
    return dataclasses.replace(RendezvousSettings.from_parameters(params), consul=doctor_consul(args))


def check_rendezvous(args: argparse.Namespace) -> list[Finding]:
    """``rdzv``: the token may write and delete under the key prefix; ``run``: ``--rdzv-id`` is not closed;
    ``gate``: what the health gate decides for this node."""
    try:
        settings = rendezvous_settings(args)
    except ConfigError as exc:
        return [Finding("rdzv", False, str(exc), bad_input=True)]
    except ImportError as exc:  # the torchrun line says why
        return [Finding("rdzv", False, f"torch's rendezvous is not importable ({exc})")]
    found = [_probe_key_prefix(settings)]
    if args.rdzv_id:
        found.append(_run_state(settings))
    return [*found, _health_gate(settings)]


def _probe_key_prefix(settings: RendezvousSettings) -> Finding:
    key = f"{settings.key_prefix}/.doctor-{secrets.token_hex(8)}"
    fix = (f"give the agents' token write on key_prefix \"{settings.key_prefix}/\" (docs/howto/torchrun.md), or "
           "choose --rdzv-conf key_prefix=...")
    try:
        written = api.kv_cas(settings.consul, key, {"doctor": True}, 0)
    except ConsulError as exc:
        return Finding("rdzv", False, f"cannot write {key}: {exc}", fix if exc.status == 403 else "")
    if not written:
        return Finding("rdzv", False, f"Consul refused to create {key} (a check-and-set on a new key)", fix)
    try:
        api.kv_delete(settings.consul, key)
    except ConsulError as exc:
        return Finding("rdzv", False, f"wrote {key} but cannot delete it: {exc}", fix)
    return Finding("rdzv", True, f"can write and delete keys under {settings.key_prefix}/ "
                   f"at {settings.consul.base_url}")


def _run_state(settings: RendezvousSettings) -> Finding:
    from torch.distributed.elastic.rendezvous import RendezvousError

    from hvd_elastic.torchrun.backend import ConsulRendezvousBackend

    run = f"--rdzv-id={settings.run_id!r}"
    try:
        got = ConsulRendezvousBackend(settings).get_state()
        state = None if got is None else pickle.loads(got[0])  # check_state allowed only torch's state classes
    except RendezvousError as exc:
        return Finding("run", False, f"{run}: {exc}")
    if state is None:
        return Finding("run", True, f"{run} is new: the first agent creates its state")
    if state.closed:
        return Finding("run", False, f"{run} was closed by its last job: torchrun would refuse to join it",
                       f"choose another --rdzv-id, or delete the old run: consul kv delete -recurse "
                       f"{settings.run_prefix}/")
    return Finding("run", True, f"{run} is open: round {state.round}, {len(state.participants)} node(s) in it")


def _health_gate(settings: RendezvousSettings) -> Finding:
    from hvd_elastic.health.hosts import MalformedResponse
    from hvd_elastic.torchrun.gate import HealthGate

    if settings.health_gate == "false":
        return Finding("gate", True, "off (health_gate=false): drains and health checks do not reach torchrun")
    try:
        health = HealthGate(settings.consul, settings.service, required=settings.health_gate == "true").read_now()
    except (ConsulError, MalformedResponse) as exc:
        return Finding("gate", False, f"cannot read this node's health: {exc}")
    if not health.registered:  # admitted under auto, but no drain or check of ours reaches it: a warning
        return Finding("gate", False, health.why, NODE_AGENT_FIX, required=not health.admitted)
    return Finding("gate", health.admitted, ("admitted: " if health.admitted else "kept out: ") + health.why,
                   "" if health.admitted else "undrain the node (hvd-elastic undrain) or fix its failing check")


CHECKS: dict[str, list[Callable[[argparse.Namespace], Finding]]] = {
    "horovodrun": [check_python, check_torch, check_horovod, check_mpi, check_gpus, check_cuda, check_consul,
                   check_token, check_disk, check_ssh],
    "torchrun": [check_python, check_torch, check_torchrun, check_gpus, check_cuda, check_consul, check_token,
                 check_disk],
}


_non_negative = argument_type(float, lambda v: 0 <= v < float("inf"), "a number >= 0")


def rdzv_conf(text: str) -> dict[str, str]:
    """torchrun's ``--rdzv-conf`` form: ``key=value`` pairs joined by commas."""
    pairs = [pair.partition("=") for pair in text.split(",") if pair.strip()]
    for key, sep, _ in pairs:
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE,... (as torchrun's --rdzv-conf)")
    return {key.strip(): value.strip() for key, _, value in pairs}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint-dir", default=env("HVD_ELASTIC_CHECKPOINT_DIR", "."),
                        help="where checkpoints will be written (env HVD_ELASTIC_CHECKPOINT_DIR; default: .)")
    parser.add_argument("--min-free-gib", type=_non_negative, default=1.0,
                        help="free disk required at --checkpoint-dir, in GiB (default %(default)s)")
    parser.add_argument("--require-gpu", action="store_true", help="fail, not warn, when no GPU is visible")
    parser.add_argument("--hosts", type=host_list, metavar="H1,H2,...", default=[],
                        help="also check over ssh that each of these hosts sees --checkpoint-dir "
                             "(the same shared directory), one 'shared' line per host")
    parser.add_argument("--launcher", choices=tuple(CHECKS), default="horovodrun",
                        help="what the job is launched with (default %(default)s)")
    parser.add_argument("--rdzv-endpoint", default="", metavar="HOST:PORT",
                        help="with --launcher torchrun: torchrun's --rdzv-endpoint (default: the Consul agent "
                             "below)")
    parser.add_argument("--rdzv-id", default="", help="with --launcher torchrun: the run id to check")
    parser.add_argument("--rdzv-conf", type=rdzv_conf, default={}, metavar="KEY=VALUE,...",
                        help="with --launcher torchrun: torchrun's --rdzv-conf (key_prefix, health_gate, service)")
    parser.add_argument("--timeout", type=positive_seconds, default=2.0,
                        help="how long to wait for the Consul agent (seconds, or e.g. 500ms; default %(default)s)")
    add_consul_arguments(parser)


def findings(args: argparse.Namespace) -> Iterator[Finding]:
    """Every check's finding as soon as it is made; on a terminal, which check runs meanwhile (some take
    seconds: importing torch, ``horovodrun --check-build``)."""
    progress = sys.stderr.isatty()
    for check in CHECKS[args.launcher]:
        if progress:
            sys.stderr.write(f"checking {check.__name__.removeprefix('check_')}...\r")
            sys.stderr.flush()
        finding = check(args)
        if progress:
            sys.stderr.write("\x1b[K")  # erase the progress line before the finding takes its place
        yield finding
    if args.launcher == "torchrun":
        yield from check_rendezvous(args)
    yield from check_shared_dir(args)


def run(args: argparse.Namespace) -> int:
    failed = []
    for finding in findings(args):
        print(finding.line(), flush=True)
        if not finding.ok and finding.required:
            failed.append(finding)
    if failed:
        # One name per kind of check: --hosts makes a "shared" line per host.
        names = ", ".join(dict.fromkeys(f.name for f in failed))
        code = 2 if any(f.bad_input for f in failed) else 1  # a bad setting is bad input, as for every command
        return fail(command_name(args), f"{len(failed)} required check(s) failed: {names}", code)
    return 0
