"""Go value formats that Consul's HTTP API speaks: durations and unsigned integers.

Consul parses ``?wait=``, check intervals and session TTLs with Go's
``time.ParseDuration`` and prints them with ``time.Duration.String``; the dev
agent must accept and print exactly the same spellings.
"""

from __future__ import annotations

import re

NANOSECOND = 1
MICROSECOND = 1_000
MILLISECOND = 1_000_000
SECOND = 1_000_000_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE

_UNITS = {
    "ns": NANOSECOND,
    "us": MICROSECOND,
    "\u00b5s": MICROSECOND,  # micro sign
    "\u03bcs": MICROSECOND,  # Greek mu
    "ms": MILLISECOND,
    "s": SECOND,
    "m": MINUTE,
    "h": HOUR,
}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
_UINT = re.compile(r"[0-9]+")
_MAX_UINT64 = 2**64 - 1


def parse_duration(text: str) -> int:
    """Parse a Go duration string ("1m30s", "500ms", "-2h") into nanoseconds.

    Raises ValueError with Go's wording for anything ``time.ParseDuration``
    rejects (a bare number other than "0", an unknown unit, an empty string).
    """
    original = text
    sign = 1
    if text and text[0] in "+-":
        sign = -1 if text[0] == "-" else 1
        text = text[1:]
    if text == "0":
        return 0
    if not text:
        raise ValueError(f'time: invalid duration "{original}"')
    total = 0.0
    pos = 0
    while pos < len(text):
        match = _PART.match(text, pos)
        if match is None:
            if re.match(r"(\d+(?:\.\d*)?|\.\d+)$", text[pos:]):
                raise ValueError(f'time: missing unit in duration "{original}"')
            unit = re.match(r"(?:\d+(?:\.\d*)?|\.\d+)(\D*)", text[pos:])
            if unit and unit.group(1):
                raise ValueError(f'time: unknown unit "{unit.group(1)}" in duration "{original}"')
            raise ValueError(f'time: invalid duration "{original}"')
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if total > 2**63 - 1:
        raise ValueError(f'time: invalid duration "{original}"')
    return sign * int(round(total))


def format_duration(ns: int) -> str:
    """Format nanoseconds like Go's ``time.Duration.String`` ("1m30s", "1.5s", "0s")."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < SECOND:
        for unit, size in (("ms", MILLISECOND), ("\u00b5s", MICROSECOND), ("ns", NANOSECOND)):
            if ns >= size:
                return sign + _fraction(ns, size) + unit
    hours, rest = divmod(ns, HOUR)
    minutes, rest = divmod(rest, MINUTE)
    text = _fraction(rest, SECOND) + "s"
    if hours:
        text = f"{hours}h{minutes}m" + text
    elif minutes:
        text = f"{minutes}m" + text
    return sign + text


def _fraction(value: int, unit: int) -> str:
    whole, frac = divmod(value, unit)
    if not frac:
        return str(whole)
    digits = str(frac).rjust(len(str(unit)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"


def parse_uint64(text: str) -> int:
    """Parse like Go's ``strconv.ParseUint(text, 10, 64)``; ValueError otherwise."""
    if not _UINT.fullmatch(text) or int(text) > _MAX_UINT64:
        raise ValueError(f'strconv.ParseUint: parsing "{text}": invalid syntax')
    return int(text)
