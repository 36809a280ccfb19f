"""Unit tests of discovery's pure rules: validation, health, merging, output."""

from __future__ import annotations

import pytest

from hvd_elastic.health.hosts import (
    Decision,
    HostNaming,
    MalformedResponse,
    Options,
    Verdict,
    evaluate,
    format_hosts,
    merge,
    parse_slots,
)


def entry(node="n1", slots="2", *, address="10.0.0.1", service_address="", checks=None, tags=None, meta=None, sid=None):
    meta = {"slots": slots} if meta is None and slots is not None else (meta or {})
    return {
        "Node": {"Node": node, "Address": address},
        "Service": {"ID": sid or f"horovod-{node}", "Service": "horovod", "Address": service_address, "Meta": meta,
                    "Tags": tags or []},
        "Checks": checks if checks is not None else [
            {"CheckID": "serfHealth", "Status": "passing"},
            {"CheckID": f"service:horovod-{node}", "Status": "passing"},
        ],
    }


@pytest.mark.parametrize("value,expected", [("1", 1), ("8", 8), ("128", 128), ("0", None), ("-1", None), ("1.5", None),
                                            (" 2", None), ("2 ", None), ("+3", None), ("1e3", None), ("٣", None),
                                            ("", None), (None, None), (4, None), ("abc", None)])
def test_parse_slots(value, expected):
    assert parse_slots(value) == expected


def test_accepts_healthy_entries_sorted_by_host():
    decisions = evaluate([entry("n2", "4"), entry("n1", "2")])
    assert all(d.accepted for d in decisions)
    assert merge(decisions) == [("n1", 2), ("n2", 4)]
    assert format_hosts(merge(decisions)) == "n1:2\nn2:4\n"


def test_any_non_passing_check_excludes_the_entry():
    warning = entry("n1", checks=[{"CheckID": "serfHealth", "Status": "passing"},
                                  {"CheckID": "service:x", "Status": "warning"}])
    node_down = entry("n2", checks=[{"CheckID": "serfHealth", "Status": "critical"}])
    unknown = entry("n3", checks=[{"CheckID": "c", "Status": "weird"}])
    decisions = evaluate([warning, node_down, unknown, entry("n4")])
    assert [d.verdict for d in decisions] == [Verdict.UNHEALTHY] * 3 + [Verdict.ACCEPTED]
    assert [d.health for d in decisions[:2]] == ["warning", "critical"]
    assert merge(decisions) == [("n4", 2)]


def test_maintenance_is_reported_with_its_reason():
    drained = entry("n1", checks=[{"CheckID": "_service_maintenance:horovod-n1", "Status": "critical",
                                   "Notes": "slurm wants it back"}])
    node_maint = entry("n2", checks=[{"CheckID": "_node_maintenance", "Status": "critical", "Notes": ""}])
    d1, d2 = evaluate([drained, node_maint])
    assert (d1.verdict, d1.health, d1.maintenance) == (Verdict.UNHEALTHY, "maintenance", "slurm wants it back")
    assert d2.health == "maintenance" and d2.maintenance == "maintenance"
    assert merge([d1, d2]) == []


def test_malicious_host_names_never_reach_the_output():
    bad = ["-oProxyCommand=touch /tmp/pwned", "a;b", "host:1:2"]
    entries = [entry(n, sid=f"s{i}") for i, n in enumerate(bad)] + [entry("good")]
    decisions = evaluate(entries)
    assert [d.verdict for d in decisions] == [Verdict.BAD_HOST] * 3 + [Verdict.ACCEPTED]
    assert all(d.warn for d in decisions[:3])
    out = format_hosts(merge(decisions))
    assert out == "good:2\n"
    assert not any(b in out for b in bad)


def test_host_naming_choices():
    e = entry("n1", address="10.0.0.1", service_address="10.9.9.9")
    no_service_address = entry("n2", address="10.0.0.2")
    assert [d.host for d in evaluate([e, no_service_address], Options(naming=HostNaming.NODE))] == ["n1", "n2"]
    assert ([d.host for d in evaluate([e, no_service_address], Options(naming=HostNaming.SERVICE_ADDRESS))]
            == ["10.9.9.9", "10.0.0.2"])
    assert ([d.host for d in evaluate([e, no_service_address], Options(naming=HostNaming.NODE_ADDRESS))]
            == ["10.0.0.1", "10.0.0.2"])
    bad_address = entry("n3", service_address="-oProxyCommand=x")
    assert evaluate([bad_address], Options(naming=HostNaming.SERVICE_ADDRESS))[0].verdict is Verdict.BAD_HOST


def test_invalid_slots_are_dropped_and_default_slots_only_fill_missing_keys():
    entries = [entry("n1", "0"), entry("n2", "many"), entry("n3", None), entry("n4", "3")]
    decisions = evaluate(entries)
    assert [d.verdict for d in decisions] == [Verdict.BAD_SLOTS] * 3 + [Verdict.ACCEPTED]
    assert "'many'" in decisions[1].reason and "missing" in decisions[2].reason
    with_default = evaluate(entries, Options(default_slots=1))
    assert [d.slots for d in with_default] == [None, None, 1, 3]


def test_slots_key_and_cap():
    e = entry("n1", meta={"gpus": "8"})
    assert evaluate([e], Options(slots_key="gpus", max_slots_per_host=8))[0].slots == 8
    over = evaluate([e], Options(slots_key="gpus", max_slots_per_host=4))[0]
    assert over.verdict is Verdict.BAD_SLOTS and over.warn and "8, above the maximum of 4" in over.reason
    assert evaluate([e])[0].verdict is Verdict.BAD_SLOTS


def test_default_cap_drops_absurd_slot_counts():
    decisions = evaluate([entry("n1", "99999999999999999999"), entry("n2", "1024"), entry("n3", "1025")])
    assert [d.verdict for d in decisions] == [Verdict.BAD_SLOTS, Verdict.ACCEPTED, Verdict.BAD_SLOTS]
    assert merge(decisions) == [("n2", 1024)]


def test_exclude_and_tags():
    entries = [entry("n1", tags=["a100", "prod"]), entry("N2", tags=["prod"]), entry("n3", tags=["a100"])]
    decisions = evaluate(entries, Options(exclude=frozenset({"n2"}), tags=("prod",)))
    assert [d.verdict for d in decisions] == [Verdict.ACCEPTED, Verdict.EXCLUDED, Verdict.EXCLUDED]
    assert merge(decisions) == [("n1", 2)]


def test_merging_several_instances_on_one_host_takes_the_largest():
    entries = [entry("n1", "2", sid="a"), entry("n1", "8", sid="b"), entry("n1", "4", sid="c")]
    assert merge(evaluate(entries)) == [("n1", 8)]
    # Two nodes sharing a service address merge the same way.
    shared = [entry("n1", "1", service_address="10.0.0.5"), entry("n2", "3", service_address="10.0.0.5")]
    assert merge(evaluate(shared, Options(naming=HostNaming.SERVICE_ADDRESS))) == [("10.0.0.5", 3)]


def test_merge_ignores_rejected_decisions():
    rejected = Decision("n1", "s", "n1", 99, Verdict.UNHEALTHY, "critical", "critical", "")
    assert merge([rejected]) == []


@pytest.mark.parametrize(
    "payload",
    [
        {"Node": "x"},
        "text",
        [1],
        [{"Node": "n1", "Service": {}, "Checks": []}],
        [{"Node": {"Node": 5}, "Service": {}, "Checks": []}],
        [{"Node": {"Node": "n1"}, "Service": {"Meta": []}, "Checks": []}],
        [{"Node": {"Node": "n1"}, "Service": {}, "Checks": ["passing"]}],
        [{"Node": {"Node": "n1"}, "Service": {}, "Checks": [{"CheckID": "c"}]}],
    ],
)
def test_malformed_responses_raise(payload):
    with pytest.raises(MalformedResponse):
        evaluate(payload)


def test_one_malformed_entry_rejects_the_whole_answer():
    with pytest.raises(MalformedResponse):
        evaluate([entry("n1"), {"Node": None, "Service": {}, "Checks": 3}])


def test_null_meta_tags_and_empty_list():
    e = entry("n1")
    e["Service"]["Meta"] = None
    e["Service"]["Tags"] = None
    assert evaluate([e], Options(default_slots=2))[0].accepted
    assert merge(evaluate([])) == [] and format_hosts([]) == ""
