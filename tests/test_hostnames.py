"""The one rule for host names handed to ssh (:mod:`hvd_elastic.hostnames`)."""

from __future__ import annotations

import pytest

from hvd_elastic.hostnames import is_valid_host


@pytest.mark.parametrize("name", ["node1", "gpu-07.rack3.example.com", "localhost", "127.0.0.1", "10.1.2.255", "a",
                                  "A1-b2", "x" * 63, ".".join(["a" * 63] * 3) + ".abc"])
def test_valid_hosts(name):
    assert is_valid_host(name)


@pytest.mark.parametrize(
    "name",
    [
        "", "-oProxyCommand=touch /tmp/pwned", "-node", "node-", "a;b", "a b", "host:1:2", "host:1", "a|b", "a&b",
        "$(reboot)", "`id`", "a/b", "user@host", "node_1", "x" * 64, "a..b", ".a", "a.", "a\nb", "nöde",
        "256.1.1.1", "1.2.3", "1.2.3.4.5", "01.2.3.4", "::1", "[::1]", "1.2.3.4 ", "a" * 254,
    ],
)
def test_invalid_hosts(name):
    assert not is_valid_host(name)
