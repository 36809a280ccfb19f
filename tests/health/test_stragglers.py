"""The straggler drain's shared format: the job's request, the node's maintenance reason, the cool-down."""

from __future__ import annotations

import json

import pytest

from hvd_elastic.health import stragglers

REQUEST = stragglers.Request(host="gpu-3", ratio=2.914, host_s=0.30121, job_median_s=0.10337, windows=3, window=50)


def test_request_key_names_the_instance():
    assert stragglers.request_key("horovod", "node-7", "horovod-slurm-12") == \
        "hvd-elastic/straggler-drain/horovod/node-7/horovod-slurm-12"


def test_request_round_trips_through_its_json():
    assert stragglers.Request.from_json(json.dumps(REQUEST.fields())) == REQUEST
    assert stragglers.Request.from_json(json.dumps(REQUEST.fields()).encode()) == REQUEST


@pytest.mark.parametrize("text", ["", "[]", "{}", '{"host": "a"}', "not json", '{"host": "a", "ratio": "x", '
                                  '"host_s": 1, "job_median_s": 1, "windows": 1, "window": 1}'])
def test_anything_else_is_no_request(text):
    with pytest.raises(ValueError, match="not a straggler-drain request"):
        stragglers.Request.from_json(text)


def test_reason_names_the_figures_and_parses_back():
    drain = stragglers.Drain(count=2, until=1_796_000_000)
    reason = drain.reason(REQUEST)
    assert reason == ("hvd-elastic straggler drain #2 until 2026-11-30T00:53:20Z: host gpu-3 took 2.91x the job's "
                      "median own work per step (0.3012 s vs 0.1034 s) in 3 windows of 50 commits")
    assert stragglers.parse_reason(reason) == drain
    assert drain.due(1_796_000_000) and not drain.due(1_795_999_999)


@pytest.mark.parametrize("reason", ["", "drained by root@a at 2026-12-07T10:00:00+0000", "slurm wants it back",
                                    "hvd-elastic straggler drain #0 until 2026-11-30T01:33:20Z: x",
                                    "hvd-elastic straggler drain #1 until soon: x",
                                    "by hand: hvd-elastic straggler drain #1 until 2026-11-30T01:33:20Z: x"])
def test_an_operators_reason_is_not_a_straggler_drain(reason):
    assert stragglers.parse_reason(reason) is None


def test_cooldown_doubles_up_to_its_limit():
    assert [stragglers.cooldown(300, 3600, n) for n in range(1, 7)] == [300, 600, 1200, 2400, 3600, 3600]
    assert stragglers.cooldown(1, 10, 10**6) == 10  # no overflow for a count nobody reaches
