"""``hvd-elastic node-agent``: register this node in its local Consul agent and keep it honest.

Runs beside the Consul agent on every training node (see
``scripts/systemd/hvd-elastic-node-agent.service``), or as a Slurm worker job
(``scripts/slurm/worker.sbatch``).  Slots default to the GPUs of the Slurm
allocation (:mod:`.slurm`), else the GPUs ``nvidia-smi`` shows (limited by
CUDA_VISIBLE_DEVICES), else ``--cpu-slots``.  On SIGTERM/SIGINT it drains the
node and waits up to ``--leave-timeout`` for the job to leave, then
deregisters and exits 0; 2 on bad input.  Consul being unreachable is not
fatal (it is retried and logged); what waiting cannot heal is (exit 1, one
line): Consul refusing the first registration (400, 403), or the service ID
kept by another live node agent of this host.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import socket

from hvd_elastic import __version__
from hvd_elastic.gotypes import MINUTE, SECOND, format_duration
from hvd_elastic.envvars import DURATION, parse_seconds
from hvd_elastic.options import (
    add_consul_arguments,
    add_service_argument,
    argparse_type,
    argument_type,
    boolean,
    command_name,
    consul_config,
    env,
    env_list,
    fail,
    non_negative_seconds,
    positive_int,
    positive_seconds,
    setting,
    stop_on_signals,
)
from hvd_elastic.standby import protocol as standby_protocol

log = logging.getLogger("hvd_elastic.nodeagent")

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\Z", re.IGNORECASE)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_META_KEY = re.compile(r"[A-Za-z0-9_-]{1,128}\Z")
METRICS_ENV = "HVD_ELASTIC_NODE_METRICS_ADDR"  # not the job's HVD_ELASTIC_METRICS_ADDR: both run on a node


def byte_size(text: str) -> int:
    """``"512M"``, ``"2G"``, ``"1.5T"`` (binary units) or plain bytes."""
    match = _SIZE.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (expected bytes or a number with K, M, G or T)")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def deregister_after(text: str) -> str:
    """A duration of at least a minute (Consul's floor for DeregisterCriticalServiceAfter), as Consul prints it."""
    try:
        ns = round(parse_seconds(text) * SECOND)
    except (ValueError, OverflowError):
        ns = None
    if ns is None or ns < MINUTE:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration of at least 1m (expected e.g. 90s, 10m, 1h)")
    return format_duration(ns)


#: The shortest TTL: a node agent's Consul calls may take up to a second, and an update must land within it.
MIN_TTL_S = 1.0
ttl_seconds = argument_type(parse_seconds, lambda v: MIN_TTL_S <= v < float("inf"),
                            f"a duration of at least {MIN_TTL_S:g}s ({DURATION})")
port_number = argument_type(int, lambda v: 0 < v < 65536, "a port number (1-65535)")


def meta_item(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not _META_KEY.match(key) or len(value) > 512:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE "
                                         "(key: letters, digits, _ or -; value up to 512 characters)")
    return key, value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_service_argument(parser)
    parser.add_argument("--service-id", default=env("HVD_ELASTIC_SERVICE_ID"),
                        help="service instance ID, unique on this agent (env HVD_ELASTIC_SERVICE_ID; default the "
                             "service name, <service>-slurm-<SLURM_JOB_ID> in a Slurm job)")
    parser.add_argument("--address", default=env("HVD_ELASTIC_ADDRESS"),
                        help="service address (env HVD_ELASTIC_ADDRESS; default empty: Consul uses the node's address)")
    parser.add_argument("--port", type=port_number, default=None, help="service port to advertise (optional)")
    parser.add_argument("--tag", action="append", dest="tags", default=None,
                        help="service tag; repeat for several (env HVD_ELASTIC_TAGS, comma-separated)")
    parser.add_argument("--meta", action="append", type=meta_item, default=[], metavar="KEY=VALUE",
                        help="extra Service.Meta entry; repeat for several")
    parser.add_argument("--slots", type=positive_int, default=env("HVD_ELASTIC_SLOTS"),
                        help="slots to advertise (env HVD_ELASTIC_SLOTS; default the Slurm job's GPUs on this node, "
                             "else the GPUs detected, else --cpu-slots)")
    parser.add_argument("--cpu-slots", type=positive_int, default=env("HVD_ELASTIC_CPU_SLOTS", "1"),
                        help="slots of a node without GPUs (env HVD_ELASTIC_CPU_SLOTS; default %(default)s)")
    parser.add_argument("--ttl", type=ttl_seconds, default=env("HVD_ELASTIC_TTL", "15s"),
                        help="TTL of the health check (seconds, or e.g. 15s, 1m): a node silent this long turns "
                             "critical; at least 1s (env HVD_ELASTIC_TTL; default %(default)s)")
    parser.add_argument("--interval", type=positive_seconds, default=None,
                        help="time between probes and TTL updates, at most half of --ttl (default a third of --ttl)")
    parser.add_argument("--deregister-after", type=deregister_after, default=env("HVD_ELASTIC_DEREGISTER_AFTER", "10m"),
                        help="Consul removes the service after it stayed critical this long (min 1m; default "
                             "%(default)s)")
    parser.add_argument("--probe", action="append", dest="probes", default=None, metavar="NAME|MODULE:FACTORY",
                        help="health probe to run; repeat for several (env HVD_ELASTIC_PROBES, comma-separated; "
                             "default gpus,memory,disk, and slurm in a Slurm job)")
    parser.add_argument("--min-free-memory", type=byte_size, default=env("HVD_ELASTIC_MIN_FREE_MEMORY", "1G"),
                        help="memory probe threshold (env HVD_ELASTIC_MIN_FREE_MEMORY; default %(default)s)")
    parser.add_argument("--min-free-disk", type=byte_size, default=env("HVD_ELASTIC_MIN_FREE_DISK", "1G"),
                        help="disk probe threshold on --checkpoint-path (env HVD_ELASTIC_MIN_FREE_DISK; default "
                             "%(default)s)")
    parser.add_argument("--checkpoint-path", default=env("HVD_ELASTIC_CHECKPOINT_DIR", "."),
                        help="where checkpoints are written; the disk probe watches it (env "
                             "HVD_ELASTIC_CHECKPOINT_DIR; default the working directory)")
    parser.add_argument("--leave-timeout", type=non_negative_seconds, default=env("HVD_ELASTIC_LEAVE_TIMEOUT", "0"),
                        metavar="SECONDS",
                        help="on SIGTERM, drain this node first and wait up to SECONDS for the job to leave it "
                             "before deregistering (env HVD_ELASTIC_LEAVE_TIMEOUT; default %(default)s: deregister at "
                             "once); keep it below the time to SIGKILL")
    parser.add_argument("--standby", type=argparse_type(standby_protocol.NAME), default=env("HVD_ELASTIC_STANDBY"),
                        metavar="NAME",
                        help="announce this node only once the job's warm standby NAME answers (hvd-elastic standby; "
                             "env HVD_ELASTIC_STANDBY; default: announce at once)")
    parser.add_argument("--standby-wait", type=non_negative_seconds, default=env("HVD_ELASTIC_STANDBY_WAIT", "120"),
                        metavar="SECONDS", help="the longest a node waits for its standby before joining without one "
                                                "(env HVD_ELASTIC_STANDBY_WAIT; default %(default)s)")
    add_straggler_arguments(parser)
    parser.add_argument("--metrics-addr", type=metrics_addr, default=env(METRICS_ENV), metavar="[HOST]:PORT",
                        help="serve this agent's Prometheus metrics at http://HOST:PORT/metrics (a bare port binds "
                             f"127.0.0.1) and advertise the port as Meta.metrics_port (env {METRICS_ENV}; default off)")
    add_consul_arguments(parser)


def add_straggler_arguments(parser: argparse.ArgumentParser) -> None:
    """The node's half of a straggler drain (:mod:`hvd_elastic.nodeagent.straggler_drain`)."""
    parser.add_argument("--straggler-drains", type=boolean, default=env("HVD_ELASTIC_STRAGGLER_DRAINS", "true"),
                        metavar="BOOL",
                        help="carry out a job's request to drain this node for being slow (straggler policy drain) "
                             "and lift that drain after --straggler-cooldown (env HVD_ELASTIC_STRAGGLER_DRAINS; "
                             "default %(default)s)")
    parser.add_argument("--straggler-cooldown", type=positive_seconds,
                        default=env("HVD_ELASTIC_STRAGGLER_COOLDOWN", "5m"), metavar="DURATION",
                        help="how long a node drained for being slow stays out, doubled for each such drain after "
                             "the first (env HVD_ELASTIC_STRAGGLER_COOLDOWN; default %(default)s)")
    parser.add_argument("--straggler-cooldown-max", type=positive_seconds,
                        default=env("HVD_ELASTIC_STRAGGLER_COOLDOWN_MAX", "1h"), metavar="DURATION",
                        help="the longest cool-down the doubling reaches (env HVD_ELASTIC_STRAGGLER_COOLDOWN_MAX; "
                             "default %(default)s)")


def metrics_addr(text: str) -> str:
    """argparse type of ``--metrics-addr``: checked now (exit 2), bound at start."""
    from hvd_elastic.metrics.address import MetricsAddressError, parse

    try:
        parse(text, "--metrics-addr")
    except MetricsAddressError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def build_agent(args: argparse.Namespace, metrics=None, metrics_port: int | None = None):
    """The configured NodeAgent; raises ConfigError or ValueError on bad input."""
    import psutil

    from hvd_elastic.nodeagent.loop import KEEPER_META, NodeAgent, Registration, this_process
    from hvd_elastic.nodeagent.probes import ProbeSettings, load_probe, query_gpus

    from hvd_elastic.nodeagent import slurm, standby  # noqa: F401 -- registers their probes

    config = consul_config(args)
    config.ssl_context()  # unreadable TLS files: exit 2 now, not a warning every tick
    job = slurm.allocation(os.environ)
    gpus = query_gpus()
    slots = args.slots or (job.gpus if job else None) or gpus.count or args.cpu_slots
    meta = {
        "slots": str(slots),
        "gpu_count": str(gpus.count),
        "cpu_count": str(os.cpu_count() or 0),
        "memory_mib": str(psutil.virtual_memory().total // 2**20),
        "host": socket.gethostname()[:512],
        "hvd_elastic_version": __version__,
    }
    if gpus.count:
        meta.update(gpu_model=gpus.model[:512], gpu_memory_mib=str(gpus.memory_mib))
    if job:
        meta.update(slurm_job_id=job.job_id, slurm_node=job.node_name)
    for reserved, flag in (("slots", "--slots"), ("metrics_port", "--metrics-addr"), (KEEPER_META, None)):
        if reserved in dict(args.meta):
            raise ValueError(f"--meta {reserved}=... is not allowed: " + (f"use {flag}" if flag else "the agent's own"))
    meta.update(dict(args.meta))
    meta[KEEPER_META] = this_process()
    if metrics_port is not None:
        meta["metrics_port"] = str(metrics_port)  # for Prometheus's consul_sd_configs (README)
    settings = ProbeSettings(
        expected_gpus=gpus.count,
        min_free_memory=args.min_free_memory,
        min_free_disk=args.min_free_disk,
        checkpoint_path=args.checkpoint_path,
        slurm_node=job.node_name if job else "",
        standby_name=args.standby or "",
        standby_wait=args.standby_wait,
    )
    default_probes = ["gpus", "memory", "disk", *(["slurm"] if job else [])]
    specs = args.probes if args.probes is not None else (env_list("HVD_ELASTIC_PROBES") or default_probes)
    if args.standby and "standby" not in specs:
        specs = [*specs, "standby"]
    probes = [load_probe(spec, settings) for spec in specs]
    registration = Registration(
        service=args.service,
        service_id=args.service_id or (job.service_id(args.service) if job else args.service),
        meta=meta,
        ttl=args.ttl,
        deregister_after=args.deregister_after,
        address=args.address,
        port=args.port,
        tags=tuple(args.tags if args.tags is not None else env_list("HVD_ELASTIC_TAGS")),
    )
    return NodeAgent(config, registration, probes, interval=interval(args),
                     leave_timeout=args.leave_timeout, metrics=metrics, watch_maintenance=metrics_port is not None,
                     straggler_drains=straggler_drains(args, registration))


def straggler_drains(args: argparse.Namespace, registration):
    """The agent's StragglerDrains, None with ``--straggler-drains false``; ValueError for a cool-down past its
    limit."""
    from hvd_elastic.nodeagent.straggler_drain import StragglerDrains

    if not args.straggler_drains:
        return None
    if args.straggler_cooldown > args.straggler_cooldown_max:
        raise ValueError(f"{setting(args, 'straggler_cooldown', '--straggler-cooldown')} {args.straggler_cooldown:g}s "
                         f"is longer than {setting(args, 'straggler_cooldown_max', '--straggler-cooldown-max')} "
                         f"{args.straggler_cooldown_max:g}s (expected a cool-down at most its limit)")
    return StragglerDrains(registration.service, registration.service_id, args.straggler_cooldown,
                           args.straggler_cooldown_max)


def interval(args: argparse.Namespace) -> float:
    """Time between TTL updates: ``--interval``, at most half the TTL, so that one late update leaves the check
    passing (an interval beyond the TTL makes the node flap); default a third."""
    if args.interval is None:
        return args.ttl / 3
    if args.interval > args.ttl / 2:
        raise ValueError(f"--interval {args.interval:g}s is more than half of {setting(args, 'ttl', '--ttl')} "
                         f"{args.ttl:g}s: the check would expire between updates, or at the first late one (use "
                         f"--interval {args.ttl / 2:g}s or less, or a longer TTL)")
    return args.interval


def run(args: argparse.Namespace) -> int:
    metrics, exporter, port = None, None, None
    if args.metrics_addr:
        from hvd_elastic.metrics.exporter import Exporter
        from hvd_elastic.metrics.nodeagent import NodeAgentMetrics

        metrics = NodeAgentMetrics()
        exporter = Exporter(metrics.registry, "node agent")
        address = exporter.start(args.metrics_addr, "--metrics-addr")  # None: one line, and the agent runs on
        if address is not None:
            port = address[1]
    from hvd_elastic.nodeagent.loop import Refused

    try:
        agent = build_agent(args, metrics=metrics, metrics_port=port)
    except ValueError as exc:  # ConfigError included: bad flags, environment or TLS files
        return fail(command_name(args), exc, 2)
    action = ("draining, waiting for the job to leave, deregistering" if args.leave_timeout
              else "deregistering and exiting")
    try:
        with stop_on_signals(log, action) as stop:
            agent.run(stop)
    except Refused as exc:
        return fail(command_name(args), exc, 1)
    finally:
        if exporter is not None:
            exporter.stop()
    return 0
