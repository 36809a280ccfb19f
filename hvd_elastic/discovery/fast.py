"""The warm path of discovery: answer from the job's host cache before parsing any flag.

The job's cache is found by the raw command line and environment
(:mod:`.cachekey`).  The first call of a job (or any call that finds no usable
cache) takes the full path in :mod:`hvd_elastic.commands.discover`, which queries Consul directly and
starts the job's watcher for this key (:mod:`.watch`); the command's top
(:mod:`hvd_elastic.entry`, ``discovery/consul_hosts``) hands over to it when
:func:`answer` finds nothing, so nothing here imports the full path.

Only ``os``, ``sys``, ``time`` and a SHA-256 are imported here, no argparse,
re or json: this is the path whose cost ``benchmarks/discovery_speed.py``
holds to 2x a bare ``python3 -I -S -c pass``.
"""

from __future__ import annotations

import os
import sys

from hvd_elastic.discovery import cache
from hvd_elastic.discovery.cachekey import count_answer, job_cache_path, mark_read, read_alias


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


def emit(rec: cache.Record) -> int:
    """Print a cached answer as discovery prints a direct one (warnings on stderr); exit 0."""
    if rec.warnings:
        sys.stderr.write(rec.warnings.decode("utf-8", "replace"))
        sys.stderr.flush()
    sys.stdout.buffer.write(rec.hosts)  # one write of the complete list
    sys.stdout.flush()
    return 0


def answer(argv: list[str]) -> int | None:
    """Print the job's fresh cached answer for ``argv`` and return 0; None (nothing printed) without one.

    The caller, the top of the command, decides what a miss means: the full path.
    """
    rec = cached_answer(argv)
    return None if rec is None else emit(rec)
