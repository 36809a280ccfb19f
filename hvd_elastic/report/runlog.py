"""Reading a run directory (see :mod:`hvd_elastic.report` for its files), also while the run is still writing it.

Contracts:

* a missing directory or a missing ``events.jsonl`` is a :class:`RunDirError`
  whose message is one line naming the path and what was expected;
* the last line of a file is taken only once its newline is written (a writer
  may be in the middle of it, or was SIGKILLed there), so reading a live run
  never fails on a half-written record;
* any other line that is not a JSON object, a record of an event this version
  does not know, or a record that lacks a field the report needs is skipped
  and named in :attr:`RunLog.warnings` as ``FILE:LINE: what is wrong``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

from hvd_elastic.errors import HvdElasticError
from hvd_elastic.training.events import EVENTS as EVENT_NAMES
from hvd_elastic.training.events import json_objects

EVENTS = "events.jsonl"
PROGRESS = "progress.jsonl"
ACTIONS = "actions.jsonl"

#: The numeric fields the report reads, by event; an event of ``EVENT_NAMES`` not named here needs none.
NEEDED_NUMBERS: dict[str, tuple[str, ...]] = {"start": ("size",), "commit": ("size",), "reset": ("new_size",),
                                              "straggler": ("ratio", "host_s", "job_median_s")}
#: Fields every progress row needs (``loss`` and ``epoch`` are optional).
PROGRESS_FIELDS = ("time", "step", "size")


class RunDirError(HvdElasticError, ValueError):
    """The run directory cannot be reported on; the message is one line."""


@dataclasses.dataclass
class RunLog:
    """The usable records of one run directory, each list in file order (which is time order)."""

    directory: Path
    events: list[dict]
    progress: list[dict]
    actions: list[dict]
    warnings: list[str]

    def sizes(self) -> list[tuple[float, int]]:
        """(time, world size) of every committed step: from progress rows, else from commit events."""
        rows = self.progress or [e for e in self.events if e["event"] == "commit"]
        return [(r["time"], r["size"]) for r in rows]


def read_run(directory: str | Path) -> RunLog:
    """Read ``directory``; raises :class:`RunDirError` when it or its event log is missing."""
    directory = Path(directory)
    if not directory.is_dir():
        raise RunDirError(f"{directory}: no such directory (expected a run directory holding {EVENTS})")
    if not (directory / EVENTS).is_file():
        raise RunDirError(f"{directory / EVENTS}: missing (expected the event log of an @hvd_elastic.run job, "
                          f"its event_log= file)")
    warnings: list[str] = []
    events = [r for r in _records(directory / EVENTS, warnings) if _known_event(r, warnings)]
    progress = [r for r in _records(directory / PROGRESS, warnings) if _has_numbers(r, PROGRESS_FIELDS, warnings)]
    actions = [r for r in _records(directory / ACTIONS, warnings)
               if _has_numbers(r, ("time",), warnings) and _has_text(r, "action", warnings)]
    strip = lambda rows: [{k: v for k, v in r.items() if k != "_where"} for r in rows]  # noqa: E731
    return RunLog(directory, strip(events), strip(progress), strip(actions), warnings)


def _records(path: Path, warnings: list[str]) -> Iterator[dict]:
    """The JSON objects of the complete lines of ``path`` (none if it does not exist), each with ``_where``."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    except OSError as exc:
        warnings.append(f"{path}: cannot be read ({exc.strerror}); skipped")
        return
    complete = data[: data.rfind(b"\n") + 1]  # a last line without its newline is still being written

    def bad(number: int, raw: bytes) -> None:
        warnings.append(f"{path}:{number}: not a JSON object ({raw[:60].decode(errors='replace')!r}); skipped")

    for number, record in json_objects(complete.splitlines(), bad):
        record["_where"] = f"{path}:{number}"
        yield record


def _known_event(record: dict, warnings: list[str]) -> bool:
    name = record.get("event")
    if name not in EVENT_NAMES:
        warnings.append(f"{record['_where']}: unknown event {name!r} (known: {', '.join(EVENT_NAMES)}); skipped")
        return False
    return _has_numbers(record, ("time", *NEEDED_NUMBERS.get(name, ())), warnings)


def _has_numbers(record: dict, fields: tuple[str, ...], warnings: list[str]) -> bool:
    bad = [f for f in fields if not isinstance(record.get(f), (int, float)) or isinstance(record.get(f), bool)]
    if bad:
        warnings.append(f"{record['_where']}: {', '.join(bad)} missing or not a number; skipped")
    return not bad


def _has_text(record: dict, field: str, warnings: list[str]) -> bool:
    if not isinstance(record.get(field), str):
        warnings.append(f"{record['_where']}: {field} missing or not a string; skipped")
        return False
    return True
