"""The warm path of discovery: answer from the job's host cache before parsing any flag.

horovodrun runs discovery every second with the same command line and the same
environment for the whole job, so the cache of a job is found by a key made of
exactly those: the discovery arguments and every ``CONSUL_*`` and
``HVD_ELASTIC_*`` variable, token values masked (they never reach a file or a
file name).  Any other spelling of the same settings is another key: a miss,
never a wrong answer.  The first call of a job (or any call that finds no
usable cache) takes the full path in :mod:`.cli`, which queries Consul
directly and starts the job's watcher for this key (:mod:`.watch`).

Only ``os``, ``sys``, ``time`` and a SHA-256 are imported here, no argparse,
re or json: this is the path whose cost ``benchmarks/discovery_speed.py``
holds to 2x a bare ``python3 -I -S -c pass``.
"""

from __future__ import annotations

import os
import sys

from hvd_elastic.discovery import cache, jobdir

ENV_PREFIXES = ("CONSUL_", "HVD_ELASTIC_")
SECRET_ENV = frozenset({"CONSUL_HTTP_TOKEN"})
MASK = "<secret>"


def is_token_flag(arg: str) -> bool:
    """``--token`` or an abbreviation argparse would take for it (``--tok``), with or without ``=value``."""
    name = arg.split("=", 1)[0]
    return len(name) >= 5 and "--token".startswith(name)


def mask_tokens(argv: list[str]) -> list[str]:
    """``argv`` with every ``--token`` value replaced by a mask."""
    out, masking = [], False
    for arg in argv:
        if masking:
            out.append(MASK)
            masking = False
        elif is_token_flag(arg):
            masking = "=" not in arg
            out.append(arg if masking else arg.split("=", 1)[0] + "=" + MASK)
        else:
            out.append(arg)
    return out


def raw_key(argv: list[str], environ: dict[str, str] | None = None) -> str:
    """The cache key of a discovery command line in an environment (hex)."""
    env = os.environ if environ is None else environ
    settings = sorted(f"{k}={MASK if k in SECRET_ENV else v}" for k, v in env.items() if k.startswith(ENV_PREFIXES))
    text = "\0".join(["argv", *mask_tokens(argv), "env", *settings])
    return cache.sha256_hex(text.encode("utf-8", "surrogateescape"))


def cache_path(directory: str, key: str) -> str:
    return os.path.join(directory, f"hosts-{key[:32]}")


def job_cache_path(argv: list[str], create: bool = False) -> tuple[str, str] | None:
    """(path, key) of this job's cache for ``argv``, or None outside a job or without a private directory."""
    directory = jobdir.job_dir(jobdir.job_process(), create=create)
    if directory is None:
        return None
    key = raw_key(argv)
    return cache_path(directory, key), key


def cached_answer(argv: list[str]) -> cache.Record | None:
    """The job's fresh cache record for ``argv``, or None (a broken file also warns on stderr).

    The job's own cache first; else, where an earlier call of the job checked
    that an operator's ``--cache-file`` was written for its settings, that file
    (an alias ``PATH.alias`` names it and the settings' fingerprint).
    """
    where = job_cache_path(argv)
    if where is None:
        return None
    path, key = where
    operators = False
    try:
        rec = cache.load(path, key, (os.getuid(),))
        if rec is None:
            alias = read_alias(path + ".alias")
            if alias is not None:
                path, key = alias
                rec = cache.load(path, key, (os.getuid(), 0))  # an operator's: root's will do
                operators = True
    except cache.CacheInvalid as exc:
        sys.stderr.write(f"discover: ignoring the host cache {path}: {exc}\n")
        return None
    if rec is None or cache.untrusted_reason(rec) is not None:
        return None  # the full path queries Consul and restarts the watcher if it died
    mark_read(path)
    if operators:  # only an operator's watcher serves metrics; a job's own cache keeps no counts
        count_answer(path, "cache")
    return rec


def read_alias(alias: str) -> tuple[str, str] | None:
    """(operator's cache file, the settings fingerprint it must carry) from an alias, or None."""
    try:
        with open(alias, "rb") as f:
            target, fingerprint = f.read().decode("utf-8").split("\n")[:2]
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return target, fingerprint


def write_alias(alias: str, target: str, fingerprint: str) -> None:
    """Record that this job's calls may read ``target`` while it carries ``fingerprint`` (atomic)."""
    tmp = f"{alias}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(f"{os.path.abspath(target)}\n{fingerprint}\n")
    os.replace(tmp, alias)


#: ``PATH.answers-<source>``: one byte per answer a discovery call printed for an operator's cache ``PATH``
#: (``--cache-file``), from it or after a direct query; its watcher's ``--metrics-addr`` serves their sizes.
ANSWER_SOURCES = ("cache", "direct")


def answer_count_path(path: str, source: str) -> str:
    """The file counting answers from ``source`` (one of :data:`ANSWER_SOURCES`) for the cache ``path``."""
    return f"{path}.answers-{source}"


def count_answer(path: str, source: str) -> None:
    """Count one printed answer for the cache ``path`` (one ``O_APPEND`` byte; a reader without write access
    to the counter is simply not counted)."""
    try:
        fd = os.open(answer_count_path(path, source), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError:
        return
    try:
        os.write(fd, b".")
    except OSError:
        pass
    finally:
        os.close(fd)


def mark_read(path: str) -> None:
    """Tell the watcher its cache is still read (one utime): an unread job watcher exits (see .watch)."""
    try:
        os.utime(path + ".lock")
    except OSError:
        pass


def emit(rec: cache.Record) -> int:
    """Print a cached answer as discovery prints a direct one (warnings on stderr); exit 0."""
    if rec.warnings:
        sys.stderr.write(rec.warnings.decode("utf-8", "replace"))
        sys.stderr.flush()
    sys.stdout.buffer.write(rec.hosts)  # one write of the complete list
    sys.stdout.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``discovery/consul_hosts``: the cache when fresh, else the full path."""
    argv = sys.argv[1:] if argv is None else argv
    rec = cached_answer(argv)
    if rec is not None:
        return emit(rec)
    from hvd_elastic.discovery.cli import main as full_main

    return full_main(argv, cache_tried=True)
