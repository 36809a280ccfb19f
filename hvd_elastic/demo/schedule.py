"""The demo's event schedule: parsing ``--events`` and refusing schedules that cannot work, before anything starts.

A schedule is a comma-separated list of ``ACTION[:HOST]``:

================ ===========================================================
``drain``        ``hvd-elastic drain`` on HOST (maintenance: a graceful leave)
``undrain``      ``hvd-elastic undrain`` on HOST (it rejoins)
``add``          start the node agent of a spare HOST: a node that was not there at start joins
``kill-worker``  SIGKILL the training process on HOST (a crash: survivors roll back
                 to their last commit; HOST rejoins once its blacklist cooldown has passed)
``ttl``          SIGKILL HOST's node agent: its TTL check expires and Consul drops it
``restart``      SIGKILL the whole job and launch it again: it resumes from its last checkpoint
================ ===========================================================

Without HOST an action picks the obvious one: ``undrain`` the last drained host,
``add`` the next spare, the others the most recently joined host in the job
other than the first (which runs rank 0).  :func:`plan` walks the schedule on a
model of the hosts and raises :class:`ScheduleError` with the reason for any
step that would do nothing, target a host in the wrong state, take the job
below ``min_np``, or relaunch with fewer than the two hosts elastic horovodrun
needs at start.
"""

from __future__ import annotations

import dataclasses

from hvd_elastic.errors import HvdElasticError

ACTIONS = ("drain", "undrain", "add", "kill-worker", "ttl", "restart")
DEFAULT = "drain,undrain,add,kill-worker,ttl:127.0.0.1,restart"

# Host states of the model.
UP = "up"  # healthy in Consul and training
DRAINED = "drained"  # in maintenance
DOWN = "down"  # node agent gone: critical in Consul
SPARE = "spare"  # no node agent yet


class ScheduleError(HvdElasticError, ValueError):
    """A schedule that cannot run; the message is one line naming the step and the reason."""


@dataclasses.dataclass(frozen=True)
class Event:
    action: str
    host: str | None  # None for restart
    size_after: int  # the world size the job trains at once the event has taken effect


def parse(text: str) -> list[tuple[str, str | None]]:
    """``"drain:127.0.0.1,restart"`` -> ``[("drain", "127.0.0.1"), ("restart", None)]``."""
    steps = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            raise ScheduleError(f"--events {text!r}: empty entry (expected ACTION[:HOST],... with ACTION one of "
                                f"{', '.join(ACTIONS)})")
        action, _, host = item.partition(":")
        if action not in ACTIONS:
            raise ScheduleError(f"--events: unknown action {action!r} (expected one of {', '.join(ACTIONS)})")
        if action == "restart" and host:
            raise ScheduleError(f"--events: restart takes no host, got {item!r}")
        steps.append((action, host or None))
    return steps


def plan(steps: list[tuple[str, str | None]], start: list[str], spares: list[str], min_np: int = 1) -> list[Event]:
    """The events of ``steps`` with their hosts and resulting world sizes (one slot per host)."""
    state = {host: UP for host in start} | {host: SPARE for host in spares}
    joined = list(start)  # order in which hosts entered the job, newest last
    drained: list[str] = []
    events = []
    for number, (action, host) in enumerate(steps, start=1):
        where = f"--events step {number} ({action}{':' + host if host else ''})"
        if host is not None and host not in state:
            raise ScheduleError(f"{where}: unknown host {host!r} (the demo's hosts: {', '.join(state)})")
        if action == "restart":
            joined = [h for h in joined if state[h] == UP]
            size = _size(state)
            if size < 2:
                raise ScheduleError(f"{where}: only {size} healthy host(s) left; elastic horovodrun needs 2 to start")
            events.append(Event(action, None, size))
            continue
        host = host or _default(action, state, joined, drained, start[0])
        if host is None:
            raise ScheduleError(f"{where}: no host to {action} (hosts: "
                                f"{', '.join(f'{h} {s}' for h, s in state.items())})")
        need = {"undrain": DRAINED, "add": SPARE}.get(action, UP)
        if state[host] != need:
            raise ScheduleError(f"{where}: {host} is {state[host]}, {action} needs a host that is {need}")
        if action == "undrain":
            state[host] = UP
            drained.remove(host)
            joined.append(host)
        elif action == "add":
            state[host] = UP
            joined.append(host)
        elif action == "kill-worker":
            pass  # its host rejoins once its cooldown has passed (hvd_elastic.horovodrun): the size is the same
        else:
            state[host] = {"drain": DRAINED, "ttl": DOWN}[action]
            joined.remove(host)
            if action == "drain":
                drained.append(host)
        size = _size(state)
        if size < max(min_np, 1):
            raise ScheduleError(f"{where}: would leave {size} worker(s), below --min-np {max(min_np, 1)}")
        events.append(Event(action, host, size))
    return events


def _size(state: dict[str, str]) -> int:
    return sum(1 for s in state.values() if s == UP)


def _default(action: str, state: dict[str, str], joined: list[str], drained: list[str], first: str) -> str | None:
    if action == "undrain":
        return drained[-1] if drained else None
    if action == "add":
        return next((h for h, s in state.items() if s == SPARE), None)
    return next((h for h in reversed(joined) if h != first and state[h] == UP), None)
