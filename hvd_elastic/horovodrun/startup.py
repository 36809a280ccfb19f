"""Two start-up costs of horovodrun's elastic launcher, cut: every relaunch of a job and every new worker pays them.

1. **"Was Horovod built with Gloo?"**  ``horovodrun`` asks before anything else
   (``launch.py``'s ``_run_elastic``), and Horovod answers by forking a process
   that imports each framework's extension, so torch: seconds on a loaded box,
   paid again by every relaunch.  The answer changes only when Horovod is
   rebuilt, so a yes is kept as an empty marker file named by a digest of
   Horovod's version, its install path and the size and modification time of
   every extension library: a rebuild, an upgrade or another environment asks
   again.  A no is never kept (Horovod then raises its own error, as always).
   The markers live in ``$XDG_CACHE_HOME/hvd-elastic`` (else ``~/.cache``);
   where that cannot be written, Horovod's check simply runs.
2. **One fresh interpreter per worker.**  ``safe_shell_exec`` starts every
   worker (and every discovery-side command) through a middleman process
   made with multiprocessing's ``spawn``: a new Python that imports psutil
   and Horovod's runner before it runs ``ssh``.  For a job whose driver runs
   hvd-elastic's rules (:mod:`.rules`), the middlemen are forked from a
   ``forkserver`` instead, started once per horovodrun with that module
   preloaded (and started at once, in the background, while the driver waits
   for discovery).  It stays fork-safe for the reason Horovod avoided ``fork``
   (the launcher's own threads): the server is a single-threaded process of
   its own.  A middleman is then horovodrun's grandchild, and a discovery
   call's session leader the forkserver's child: rule 4 and discovery's reaper
   look for sessions among all of horovodrun's descendants, and discovery
   takes a forkserver's parent for its job (:mod:`hvd_elastic.discovery.jobdir`).

Contract:

* :func:`install` is called by :func:`.rules.install` and is idempotent; it
  patches ``horovod.common.util.gloo_built`` and the name
  ``horovod.runner.launch`` bound to it.  It imports nothing heavy.
* :func:`use_forkserver` changes only ``safe_shell_exec``'s view of
  ``multiprocessing``; it is called for drivers the rules apply to.
* Nothing here raises: a cache that cannot be read or written is a miss.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import sys
import threading
from collections.abc import Callable
from multiprocessing import forkserver
from pathlib import Path
from typing import Any

log = logging.getLogger("hvd_elastic.horovodrun")

CACHE_ENV = "XDG_CACHE_HOME"
_MIDDLEMAN_MODULE = "horovod.runner.common.util.safe_shell_exec"


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache") / "hvd-elastic"


def build_key(horovod_dir: Path, version: str) -> str:
    """A digest of what decides Horovod's build answers: its version, where it is, and every extension library."""
    digest = hashlib.sha256(f"{version}\0{horovod_dir.resolve()}".encode())
    for library in sorted(horovod_dir.glob("*/mpi_lib*")):
        stat = library.stat()
        digest.update(f"\0{library.relative_to(horovod_dir)}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:32]


def remembered(check: Callable[..., Any], marker: Callable[[], Path]) -> Callable[..., Any]:
    """``check`` answered from ``marker()``'s existence once it said yes; a marker that cannot be named (an
    extension library unreadable) is a miss."""

    def gloo_built(*args: Any, **kwargs: Any) -> Any:
        try:
            path: Path | None = marker()
        except OSError:
            path = None
        if path is not None and path.exists():
            return True
        answer = check(*args, **kwargs)
        if answer and path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
            except OSError as exc:  # a read-only home: Horovod's check just runs each time
                log.debug("hvd-elastic: cannot keep Horovod's Gloo answer in %s: %s", path, exc)
        return answer

    return gloo_built


def install() -> None:
    """Answer horovodrun's Gloo check from the cache (see the module docstring)."""
    import horovod
    from horovod.common import util

    if getattr(util.gloo_built, "_hvd_elastic", False):
        return
    horovod_dir = Path(horovod.__file__).parent

    def marker() -> Path:
        return cache_dir() / f"horovod-gloo-{build_key(horovod_dir, horovod.__version__)}"

    patched = remembered(util.gloo_built, marker)
    patched._hvd_elastic = True  # type: ignore[attr-defined]
    util.gloo_built = patched
    launch = sys.modules.get("horovod.runner.launch")  # mid-import: its "from ... import gloo_built" already ran
    if launch is not None and hasattr(launch, "gloo_built"):
        setattr(launch, "gloo_built", patched)  # noqa: B010 (a module mypy types without it)


class _ForkserverMultiprocessing:
    """``multiprocessing`` as ``safe_shell_exec`` sees it: its ``spawn`` context is the forkserver."""

    def __getattr__(self, name: str) -> Any:
        return getattr(multiprocessing, name)

    @staticmethod
    def get_context(method: str | None = None) -> Any:
        if method == "spawn":
            return multiprocessing.get_context("forkserver")
        return multiprocessing.get_context(method)


def use_forkserver() -> None:
    """Make ``safe_shell_exec``'s middlemen forks of one preloaded server (idempotent)."""
    from horovod.runner.common.util import safe_shell_exec

    if isinstance(safe_shell_exec.multiprocessing, _ForkserverMultiprocessing):
        return
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([_MIDDLEMAN_MODULE])
    safe_shell_exec.multiprocessing = _ForkserverMultiprocessing()
    # Started now, while the driver waits for discovery, rather than when the first worker is launched.
    threading.Thread(target=forkserver.ensure_running, name="hvd-elastic-forkserver", daemon=True).start()
