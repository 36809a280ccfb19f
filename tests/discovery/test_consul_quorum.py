"""Three real Consul servers (``ConsulCluster(servers=3)``): losing the leader is a real Raft election.

Discovery asks a node's client agent, which forwards to a server, which
forwards to the leader; while the survivors elect another, discovery must
fail cleanly (exit 1, nothing printed) or print the whole list, never a part,
and once there is a leader it must print the same hosts as before.  How long
that takes is printed (``-s`` shows it), never asserted: it is Consul's Raft
timing on a shared machine.
"""

from __future__ import annotations

import time
import uuid

import pytest
from consul_testing import clean_env, register, run_discovery

from hvd_elastic.local.realconsul import ConsulCluster, unavailable_reason

pytestmark = pytest.mark.slow

NODES = ["localhost", "127.0.0.1"]
EXPECTED = ["127.0.0.1:1", "localhost:2"]


@pytest.fixture
def consul_binary():
    if reason := unavailable_reason():
        pytest.skip(reason)  # a failure in CI (tests/conftest.py)


def registered(cluster: ConsulCluster, token: str | None = None) -> None:
    """The horovod service on both nodes (localhost 2 slots, 127.0.0.1 one), as their node agents register it."""
    register(cluster.addr("localhost"), slots="2", token=token)
    register(cluster.addr("127.0.0.1"), slots="1", token=token)


def discover(cluster: ConsulCluster, tmp_path, *args: str, agent: str = "localhost", **env: str):
    """``discovery/consul_hosts`` against ``agent``'s API (the localhost node's, or a server's), with no host
    cache (a direct query each)."""
    return run_discovery(clean_env(tmp_path, CONSUL_HTTP_ADDR=cluster.addr(agent),
                                   HVD_ELASTIC_DISCOVERY_CACHE="off", **env), *args)


def answer(result) -> list[str] | None:
    """The host list of a discovery run, None for a clean failure; anything else (a partial list) fails the test."""
    if result.returncode == 0:
        return sorted(result.stdout.split())
    assert (result.returncode, result.stdout) == (1, ""), (result.returncode, result.stdout, result.stderr)
    return None


def wait_answer(cluster, tmp_path, expected: list[str], *args: str, deadline: float | None = None,
                agent: str = "localhost", **env: str) -> None:
    """Until discovery prints ``expected`` (the catalog reaches the servers a moment after registering);
    ``deadline`` (monotonic) defaults to 60 s from now."""
    deadline = time.monotonic() + 60.0 if deadline is None else deadline
    while (seen := answer(discover(cluster, tmp_path, *args, agent=agent, **env))) != expected:
        assert time.monotonic() < deadline, f"discovery via {agent} prints {seen}, expected {expected}"
        time.sleep(0.2)


def test_losing_the_leader_elects_another_and_discovery_comes_back(consul_binary, tmp_path):
    with ConsulCluster(NODES, servers=3) as cluster:
        assert sorted(cluster.voters()) == cluster.server_nodes == [f"consul-server-{i}" for i in (1, 2, 3)]
        registered(cluster)
        wait_answer(cluster, tmp_path, EXPECTED)
        old = cluster.wait_leader()

        cluster.stop_server(old)
        killed = time.monotonic()
        new = elected = None
        failures = 0
        while True:  # until the survivors agree on a leader and discovery answers after that
            if new is None and (new := cluster.leader()) is not None:
                elected = time.monotonic()
            hosts = answer(discover(cluster, tmp_path))
            failures += hosts is None
            assert hosts in (None, EXPECTED), hosts
            if new is not None and hosts == EXPECTED:
                answered = time.monotonic()
                break
            assert time.monotonic() - killed < 120, f"no leader or no answer 120 s after killing {old}"
            time.sleep(0.1)
        assert new != old and new in cluster.server_nodes
        print(f"\nkilled leader {old}: new leader {new} after {elected - killed:.1f} s, discovery answered "
              f"correctly after {answered - killed:.1f} s ({failures} failed calls in between)")

        cluster.start_server(old)
        assert old in cluster.voters()
        # Every running server, the restarted one included, names the same leader: it came back a follower.
        assert cluster.leader() == new
        assert answer(discover(cluster, tmp_path)) == EXPECTED


def wait_every_server(cluster: ConsulCluster, tmp_path, expected: list[str], timeout: float = 60.0) -> None:
    """Until each server's OWN copy (a ``--stale`` read served by that server) holds ``expected``.

    The leader commits a write once a majority has it: one follower may still
    lack it, and a stale read it serves is then correctly older (CI saw one
    such answer, ``localhost:2`` alone, when the kill came right after the
    leader's answer).
    """
    deadline = time.monotonic() + timeout
    for server in cluster.server_nodes:
        wait_answer(cluster, tmp_path, expected, "--stale", deadline=deadline, agent=server)


def test_stale_reads_answer_from_a_follower_while_there_is_no_leader(consul_binary, tmp_path):
    """``--stale``: a follower answers from its own copy until it has not heard from a leader for ``--max-stale``
    seconds; printed: how long stale discovery kept answering after the kill, and when it answered again."""
    with ConsulCluster(NODES, servers=3) as cluster:
        registered(cluster)
        wait_answer(cluster, tmp_path, EXPECTED)
        wait_every_server(cluster, tmp_path, EXPECTED)
        old = cluster.wait_leader()
        cluster.stop_server(old)
        killed = time.monotonic()
        timeline: list[tuple[float, bool]] = []
        while cluster.leader() is None or not timeline or not timeline[-1][1]:
            hosts = answer(discover(cluster, tmp_path, "--stale", "--max-stale", "3"))
            assert hosts in (None, EXPECTED), hosts
            timeline.append((time.monotonic() - killed, hosts is not None))
            assert timeline[-1][0] < 120, f"no leader or no stale answer 120 s after killing {old}"
            time.sleep(0.1)
        failed = [t for t, ok in timeline if not ok]
        print(f"\n--stale after killing leader {old}: {len(timeline)} calls, "
              + (f"failing from {failed[0]:.1f} s to {failed[-1]:.1f} s" if failed else "none failed")
              + f", answering at {timeline[-1][0]:.1f} s with leader {cluster.leader()}")


def test_acl_master_token_bootstraps_on_every_server(consul_binary, tmp_path):
    """ACLs with a quorum: the master token, set on every server, is made by whichever becomes leader; the agent
    token lets each client agent register its node; a restricted token is made through the servers."""
    admin, reader = f"admin-{uuid.uuid4().hex}", str(uuid.uuid4())
    with ConsulCluster(NODES, servers=3, acl_token=admin, restricted_token=reader,
                       restricted_node_prefixes=[""], restricted_service_prefixes=["horovod"]) as cluster:
        registered(cluster, token=admin)
        token = tmp_path / "consul-token"
        token.write_text(reader)
        token.chmod(0o600)
        wait_answer(cluster, tmp_path, EXPECTED, CONSUL_HTTP_TOKEN_FILE=str(token))
        anonymous = discover(cluster, tmp_path)
        assert (anonymous.returncode, anonymous.stdout) == (1, ""), (anonymous.stdout, anonymous.stderr)
        assert "enforces ACLs" in anonymous.stderr, anonymous.stderr


@pytest.mark.parametrize("servers", [2, 0, 4, "3"])
def test_an_even_or_odd_typed_server_count_is_refused(servers):
    """A quorum of an even size survives no more failures than one server fewer: refused, naming the value."""
    with pytest.raises(ValueError, match=rf"^servers must be an odd number >= 1 \(1, 3, 5\.\.\.\), got {servers!r}$"):
        ConsulCluster(NODES, servers=servers)


def test_a_single_dev_server_cannot_be_stopped(consul_binary):
    """The one ``-dev`` server keeps its catalog in memory: restarting it would be a new, empty cluster."""
    cluster = ConsulCluster(NODES)
    assert cluster.server_nodes == ["consul-server"]
    with pytest.raises(RuntimeError, match="needs a quorum"):
        cluster.stop_server("consul-server")
