"""/v1/kv and /v1/session: CRUD, CAS races, locks, lock handover on node death, blocking reads."""

from __future__ import annotations

import threading
import time

import consul
import pytest
from devagent_helpers import client, wait_until


def test_kv_crud_flags_and_base64(c, raw):
    assert c.kv.put("crud/a", "one", flags=42) is True
    index, entry = c.kv.get("crud/a")
    assert (entry["Value"], entry["Flags"], entry["LockIndex"]) == (b"one", 42, 0)
    assert entry["CreateIndex"] == entry["ModifyIndex"] == int(index)
    body, _ = raw.json("GET", "/v1/kv/crud/a")
    assert body[0]["Value"] == "b25l"  # base64 on the wire
    status, headers, data = raw.request("GET", "/v1/kv/crud/a?raw")
    assert (status, data) == (200, b"one")
    assert c.kv.delete("crud/a") is True
    assert c.kv.get("crud/a")[1] is None


def test_kv_missing_key_is_404_with_index(raw):
    status, headers, body = raw.request("GET", "/v1/kv/does/not/exist")
    assert status == 404 and body == b""
    assert int(headers["x-consul-index"]) >= 1 and headers["x-consul-knownleader"] == "true"


def test_kv_recurse_keys_separator(c):
    for key in ("tree/a", "tree/b/c", "tree/b/d", "treetop"):
        c.kv.put(key, key)
    _, entries = c.kv.get("tree/", recurse=True)
    assert [e["Key"] for e in entries] == ["tree/a", "tree/b/c", "tree/b/d"]
    assert c.kv.get("tree/", keys=True)[1] == ["tree/a", "tree/b/c", "tree/b/d"]
    assert c.kv.get("tree/", keys=True, separator="/")[1] == ["tree/a", "tree/b/"]
    assert c.kv.delete("tree/", recurse=True) is True
    assert c.kv.get("tree/", recurse=True)[1] is None
    assert c.kv.get("treetop")[1]["Value"] == b"treetop"


def test_kv_cas_create_only_and_compare_and_set(c):
    assert c.kv.put("cas/k", "v0", cas=0) is True
    assert c.kv.put("cas/k", "again", cas=0) is False
    _, entry = c.kv.get("cas/k")
    assert c.kv.put("cas/k", "v1", cas=entry["ModifyIndex"] + 1000) is False
    assert c.kv.put("cas/k", "v1", cas=entry["ModifyIndex"]) is True
    assert c.kv.put("cas/k", "v2", cas=entry["ModifyIndex"]) is False  # stale index now
    _, entry = c.kv.get("cas/k")
    assert entry["Value"] == b"v1"
    assert c.kv.delete("cas/k", cas=entry["ModifyIndex"] - 1) is False
    assert c.kv.delete("cas/k", cas=entry["ModifyIndex"]) is True


def test_kv_cas_race_between_two_clients(cluster):
    a, b = client(cluster, "gpu-a"), client(cluster, "gpu-b")
    a.kv.put("race/counter", "0")
    rounds = 40

    def increment(cl, wins):
        while wins[0] < rounds:
            _, entry = cl.kv.get("race/counter")
            value = int(entry["Value"])
            if cl.kv.put("race/counter", str(value + 1), cas=entry["ModifyIndex"]):
                wins[0] += 1

    wins_a, wins_b = [0], [0]
    threads = [threading.Thread(target=increment, args=(a, wins_a)),
               threading.Thread(target=increment, args=(b, wins_b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    # No lost update: every successful CAS incremented exactly once.
    assert int(a.kv.get("race/counter")[1]["Value"]) == wins_a[0] + wins_b[0] == 2 * rounds


def test_kv_blocking_get_wakes_on_that_key_only(cluster, c):
    c.kv.put("watch/me", "1")
    index, _ = c.kv.get("watch/me")
    result = {}
    parked = cluster.watcher_count()

    def watch():
        result["r"] = c.kv.get("watch/me", index=index, wait="20s")

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    wait_until(lambda: cluster.watcher_count() > parked)
    c.kv.put("watch/other", "x")
    # The agent handles a write and the wake-ups it causes on one event loop, in
    # order, so by the time this count is answered the watcher has either parked
    # again or left for good.
    assert cluster.watcher_count() > parked, "a write to another key ended the blocking read"
    c.kv.put("watch/me", "2")
    watcher.join(timeout=60)  # a hang guard only
    # It answered with the write to its own key, not with the value before it.
    new_index, entry = result["r"]
    assert entry["Value"] == b"2" and int(new_index) > int(index)


def test_kv_value_limit_and_bad_params(raw):
    big = b"x" * (512 * 1024 + 1)
    status, _, body = raw.request("PUT", "/v1/kv/big", big)
    assert status == 413 and b"too large" in body
    assert raw.request("PUT", "/v1/kv/ok", b"x" * (512 * 1024))[0] == 200
    assert raw.request("PUT", "/v1/kv/")[::2] == (400, b"Missing key name")
    assert raw.request("PUT", "/v1/kv/x?cas=1&acquire=abc")[0] == 400
    assert raw.request("PUT", "/v1/kv/x?flags=-1")[0] == 400
    assert raw.request("DELETE", "/v1/kv/")[0] == 400
    status, headers, _ = raw.request("POST", "/v1/kv/x")
    assert status == 405 and headers["allow"] == "OPTIONS,GET,PUT,DELETE"


def test_session_create_info_renew_destroy(c, raw):
    sid = c.session.create(name="s1", ttl=10, lock_delay=0)
    _, info = c.session.info(sid)
    assert info["Name"] == "s1" and info["Node"] == "gpu-a" and info["TTL"] == "10s"
    assert info["Behavior"] == "release" and info["NodeChecks"] == ["serfHealth"] and info["LockDelay"] == 0
    assert c.session.renew(sid)["ID"] == sid
    assert any(s["ID"] == sid for s in c.session.list()[1])
    assert any(s["ID"] == sid for s in c.session.node("gpu-a")[1])
    assert c.session.destroy(sid) is True
    assert c.session.info(sid)[1] is None
    assert raw.request("PUT", f"/v1/session/renew/{sid}")[::2] == (404, f"Session id '{sid}' not found".encode())
    status, _, body = raw.request("PUT", "/v1/session/create", {"TTL": "500ms"})
    assert (status, body) == (400, b"Invalid Session TTL '500000000', must be between [1s=24h0m0s]")
    assert raw.request("PUT", "/v1/session/create", {"Behavior": "explode"})[0] == 400


def test_lock_acquire_release_and_contention(cluster):
    a, b = client(cluster, "gpu-a"), client(cluster, "gpu-b")
    sa = a.session.create(lock_delay=0)
    sb = b.session.create(lock_delay=0)
    try:
        assert a.kv.put("locks/driver", "a", acquire=sa) is True
        assert a.kv.put("locks/driver", "a2", acquire=sa) is True  # re-acquire by the holder
        assert b.kv.put("locks/driver", "b", acquire=sb) is False
        _, entry = a.kv.get("locks/driver")
        assert (entry["Session"], entry["LockIndex"], entry["Value"]) == (sa, 1, b"a2")
        assert b.kv.put("locks/driver", "b", release=sb) is False  # only the holder releases
        assert a.kv.put("locks/driver", "free", release=sa) is True
        assert b.kv.put("locks/driver", "b", acquire=sb) is True
        _, entry = b.kv.get("locks/driver")
        assert (entry["Session"], entry["LockIndex"]) == (sb, 2)
        with pytest.raises(consul.ConsulException):
            a.kv.put("locks/other", "x", acquire="00000000-dead-beef-0000-000000000000")
    finally:
        a.session.destroy(sa)
        b.session.destroy(sb)


def test_lock_handover_when_holder_node_dies(cluster):
    a, b = client(cluster, "gpu-a"), client(cluster, "gpu-b")
    holder = b.session.create(lock_delay=1)  # seconds, as py-consul sends "1s"
    waiter = a.session.create(lock_delay=0)
    try:
        assert b.kv.put("locks/leader", "gpu-b", acquire=holder) is True
        index, _ = a.kv.get("locks/leader")
        cluster.stop_node("gpu-b")  # serfHealth critical -> session invalidated -> lock released
        new_index, entry = a.kv.get("locks/leader", index=index, wait="10s")
        assert "Session" not in entry and entry["Value"] == b"gpu-b"
        assert a.session.info(holder)[1] is None
        assert a.kv.put("locks/leader", "gpu-a", acquire=waiter) is False  # lock-delay (1 s) still running
        wait_until(lambda: a.kv.put("locks/leader", "gpu-a", acquire=waiter), timeout=5, interval=0.2)
        assert a.kv.get("locks/leader")[1]["Session"] == waiter
    finally:
        cluster.start_node("gpu-b")
        a.session.destroy(waiter)


def test_session_destroy_with_delete_behavior_deletes_held_keys(c):
    sid = c.session.create(ttl=10, lock_delay=0, behavior="delete")
    assert c.kv.put("del-lock/k", "v", acquire=sid) is True
    assert c.session.renew(sid)["ID"] == sid  # renewing a TTL session keeps it and its lock
    assert c.kv.get("del-lock/k")[1]["Session"] == sid
    c.session.destroy(sid)
    assert c.kv.get("del-lock/k")[1] is None


def test_session_ttl_expiry_after_twice_the_ttl_releases_lock(c, raw):
    # The fixture lowers session_ttl_min to 1 s (Consul: 10 s) so a TTL session can lapse quickly;
    # py-consul refuses TTLs below 10 s itself, hence raw HTTP.
    sid = raw.json("PUT", "/v1/session/create", {"TTL": "1s", "LockDelay": "0s"})[0]["ID"]
    assert c.kv.put("ttl-lock/k", "v", acquire=sid) is True
    started = time.monotonic()
    wait_until(lambda: c.session.info(sid)[1] is None, timeout=10)
    assert time.monotonic() - started >= 1.5  # Consul expires after 2 x TTL, never at 1 x
    assert "Session" not in c.kv.get("ttl-lock/k")[1]


def test_identical_kv_write_does_not_move_the_index(c):
    c.kv.put("same/k", "v", flags=1)
    index, entry = c.kv.get("same/k")
    assert c.kv.put("same/k", "v", flags=1) is True
    again, entry2 = c.kv.get("same/k")
    assert (again, entry2["ModifyIndex"]) == (index, entry["ModifyIndex"])


def test_session_on_critical_check_is_refused(cluster, raw):
    a = client(cluster)
    a.agent.service.register("sess-svc", service_id="sess-svc", check=consul.Check.ttl("60s"))
    status, _, body = raw.request("PUT", "/v1/session/create", {"Checks": ["serfHealth", "service:sess-svc"]})
    assert (status, body) == (500, b"Check 'service:sess-svc' is in critical state")
    a.agent.check.ttl_pass("service:sess-svc")
    data, _ = raw.json("PUT", "/v1/session/create", {"Checks": ["serfHealth", "service:sess-svc"]})
    sid = data["ID"]
    a.agent.check.ttl_fail("service:sess-svc")
    wait_until(lambda: a.session.info(sid)[1] is None)
