"""The test bed's port allocator: distinct, never reused, outside the ephemeral range, truly free."""

from __future__ import annotations

import socket

import pytest

from testbed import ports


def _ephemeral_range() -> tuple[int, int]:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = map(int, f.read().split())
    return low, high


def test_ports_are_distinct_across_calls_and_below_the_ephemeral_range():
    low, _ = _ephemeral_range()
    got = [p for _ in range(50) for p in ports.reserve(4)]
    assert len(got) == len(set(got)) == 200
    assert all(10000 <= p < low for p in got)


def test_a_consecutive_block_is_consecutive_and_never_overlaps_later_ports():
    block = ports.reserve(3, consecutive=True)
    assert block == list(range(block[0], block[0] + 3))
    assert not set(block) & set(ports.reserve(100))


def test_a_port_in_use_is_never_returned(monkeypatch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        taken = busy.getsockname()[1]
        # make the random pick land on the busy port first, then on a free one
        picks = iter([taken, taken, 12345 if taken != 12345 else 12346])
        monkeypatch.setattr(ports.random.Random, "randrange", lambda self, a, b: next(picks))
        monkeypatch.setattr(ports, "_ephemeral_low", lambda: 65535)
        monkeypatch.setattr(ports, "_given", set())
        got = ports.reserve(1)
    assert got != [taken] and len(got) == 1


def test_exhaustion_is_an_error_naming_the_range(monkeypatch):
    monkeypatch.setattr(ports, "_bindable", lambda port, host: False)
    with pytest.raises(RuntimeError, match=r"no 2 free port\(s\) on 127.0.0.1 in 10000-"):
        ports.reserve(2)
