"""Go duration/uint formats and the bexpr subset, checked directly (no server needed)."""

from __future__ import annotations

import pytest

from hvd_elastic.devagent.bexpr import FilterError, compile_filter
from hvd_elastic.gotypes import format_duration, parse_duration, parse_uint64


@pytest.mark.parametrize("text, ns", [
    ("0", 0), ("1s", 10**9), ("1.5s", 1_500_000_000), ("1m30s", 90 * 10**9), ("500ms", 5 * 10**8),
    ("2h", 7200 * 10**9), ("-3s", -3 * 10**9), ("1us", 1000), ("1\u00b5s", 1000), ("10ns", 10), (".5s", 5 * 10**8),
])
def test_parse_duration(text, ns):
    assert parse_duration(text) == ns


@pytest.mark.parametrize("text, message", [
    ("", "invalid duration"), ("10", "missing unit"), ("5 s", "unknown unit"), ("1d", "unknown unit"),
    ("s", "invalid duration"), ("forever", "invalid duration"),
])
def test_parse_duration_rejects(text, message):
    with pytest.raises(ValueError, match=message):
        parse_duration(text)


@pytest.mark.parametrize("ns, text", [
    (0, "0s"), (10**9, "1s"), (1_500_000_000, "1.5s"), (90 * 10**9, "1m30s"), (24 * 3600 * 10**9, "24h0m0s"),
    (5 * 10**8, "500ms"), (1500, "1.5\u00b5s"), (7, "7ns"), (3661 * 10**9, "1h1m1s"),
])
def test_format_duration_like_go(ns, text):
    assert format_duration(ns) == text


def test_parse_uint64():
    assert parse_uint64("0") == 0 and parse_uint64("18446744073709551615") == 2**64 - 1
    for bad in ("", "-1", "1.0", "18446744073709551616", " 1", "0x10"):
        with pytest.raises(ValueError):
            parse_uint64(bad)


ROW = {
    "Node": {"Node": "gpu-a", "Meta": {}},
    "Service": {"ID": "w1", "Tags": ["gpu", "v1"], "Meta": {"slots": "8", "zone-a": "x"}, "Port": 80,
                "EnableTagOverride": False},
    "Checks": [{"CheckID": "serfHealth", "Status": "passing"}, {"CheckID": "service:w1", "Status": "critical"}],
}
FIELDS = {"Node", "Service", "Checks"}


@pytest.mark.parametrize("expr, expected", [
    ("Service.ID == w1", True),
    ('Service.ID == "w1" and Node.Node != gpu-b', True),
    ("Service.Port == 80", True),
    ("Service.Port == 81", False),
    ("Service.EnableTagOverride == false", True),
    ("gpu in Service.Tags", True),
    ("cpu not in Service.Tags", True),
    ("Service.Tags contains v1", True),
    ("Service.Tags not contains v1", False),
    ("slots in Service.Meta", True),  # map: key membership
    ('Service.Meta["zone-a"] == x', True),
    ("Service.Meta.missing is empty", True),
    ("Node.Meta is empty", True),
    ("Service.Tags is not empty", True),
    ("Checks.Status == critical", True),  # any element
    ("Checks.Status != critical", False),  # negation of "any is critical"
    ("Checks.Status == warning", False),
    ('Service.ID matches "^w[0-9]$"', True),
    ("not Service.ID == w1 or Service.Port == 80", True),
    ("not (Service.ID == w1 or Service.Port == 80)", False),
    ("Service.ID == w2 or Service.ID == w1 and Service.Port == 81", False),  # and binds tighter
])
def test_filter_semantics(expr, expected):
    assert compile_filter(expr, FIELDS)(ROW) is expected


@pytest.mark.parametrize("expr", ["", "Service.ID", "Service.ID ==", "(Service.ID == a", "Service.ID == a)",
                                  "Bogus.Field == 1", "and", "Service.ID is full", "Service.ID matches \"[\""])
def test_filter_rejects(expr):
    with pytest.raises(FilterError):
        compile_filter(expr, FIELDS)
