"""Which host cache file answers a discovery command line, and the files kept next to one.

horovodrun runs discovery every second with the same command line and the same
environment for the whole job, so the cache of a job is found by a key made of
exactly those: the discovery arguments and every ``CONSUL_*`` and
``HVD_ELASTIC_*`` variable, token values masked (they never reach a file, a
file name or a watcher's command line).  Any other spelling of the same
settings is another key: a miss, never a wrong answer.

Next to a cache file ``PATH`` live its watcher's lock ``PATH.lock`` (readers
touch it: :func:`mark_read`), a job's alias ``PATH.alias`` naming an
operator's cache (:func:`read_alias`) and, for an operator's cache, the answer
counters ``PATH.answers-<source>`` (:func:`count_answer`).

Import-light (``os`` plus :mod:`.cache` and :mod:`.jobdir`, which the warm path
loads anyway): :mod:`.fast` computes a key on every call.
"""

from __future__ import annotations

import os

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


def without_token_flags(argv: list[str]) -> list[str]:
    """``argv`` minus ``--token``/``--token-file`` and their values (a child gets the token by environment)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if is_token_flag(arg) or (len(name) > len("--token") and "--token-file".startswith(name)):
            skip = "=" not in arg
            continue
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
