"""Is a process still there: for tests and benchmarks that check what a crash or a kill left behind."""

from __future__ import annotations

import time

import psutil


def is_alive(proc: psutil.Process | None) -> bool:
    """Running and not a zombie: a zombie has closed its descriptors, and an orphan's reaper may take its time."""
    try:
        return proc is not None and proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_dead(proc: psutil.Process | None, timeout: float) -> bool:
    """Whether ``proc`` is gone (or a zombie) within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while is_alive(proc):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def pid_alive(pid: int) -> bool:
    """:func:`is_alive` for a pid."""
    try:
        return is_alive(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return False
