"""The blocking-query loop's index rules (:mod:`hvd_elastic.health.watch`); the loop against a scripted
Consul, writing discovery's cache, is in ``tests/discovery/test_cache_unit.py``."""

from __future__ import annotations

import pytest

from hvd_elastic.health.watch import next_index


@pytest.mark.parametrize("previous,answered,expected",
                         [(0, 7, 7), (7, 7, 7), (7, 9, 9), (9, 3, 0), (0, 0, 1), (5, 0, 0)])
def test_index_rules(previous, answered, expected):
    assert next_index(previous, answered) == expected
