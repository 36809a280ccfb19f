"""The discovery script's exit paths, against the dev Consul agent and scripted HTTP servers.

Each test runs ``discovery/consul_hosts`` (or ``hvd-elastic discover``) as a
subprocess exactly as horovodrun would, and checks the contract: complete host
lines on stdout and exit 0, or nothing on stdout, one stderr line and exit 1
(2 for bad input).
"""

from __future__ import annotations

import json
import subprocess
import threading

import pytest
from consul_testing import (RawServer, ScriptedServer, clean_env, consul_request, register, run_discovery,
                            self_signed_cert)

from hvd_elastic.local.realconsul import consul_cluster
from testbed.consul import refused_address

pytestmark = pytest.mark.slow  # each test runs the discovery script as a process


def assert_failed(result: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert result.returncode == code, result
    assert result.stdout == "", "a failed call must print no host at all"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_prints_healthy_hosts_sorted(cluster, tmp_path):
    register(cluster.addr("localhost"), slots="4")
    register(cluster.addr("127.0.0.1"), slots="2")
    env = clean_env(tmp_path, CONSUL_HTTP_ADDR=cluster.addr("localhost"))
    result = run_discovery(env)
    assert (result.returncode, result.stdout, result.stderr) == (0, "127.0.0.1:2\nlocalhost:4\n", "")
    # The subcommand is the same code path.
    assert run_discovery(env, cli=True).stdout == "127.0.0.1:2\nlocalhost:4\n"


def test_unhealthy_drained_and_dead_nodes_are_left_out(cluster, tmp_path):
    local, other = cluster.addr("localhost"), cluster.addr("127.0.0.1")
    register(local, slots="1")
    register(other, slots="1")
    env = clean_env(tmp_path, CONSUL_HTTP_ADDR=local)
    assert run_discovery(env).stdout == "127.0.0.1:1\nlocalhost:1\n"

    consul_request(other, "PUT", "/v1/agent/check/warn/service:horovod?note=degraded")
    assert run_discovery(env).stdout == "localhost:1\n"
    consul_request(other, "PUT", "/v1/agent/check/pass/service:horovod")
    assert run_discovery(env).stdout == "127.0.0.1:1\nlocalhost:1\n"

    code, _ = consul_request(other, "PUT", "/v1/agent/service/maintenance/horovod?enable=true&reason=test")
    assert code == 200
    assert run_discovery(env).stdout == "localhost:1\n"
    consul_request(other, "PUT", "/v1/agent/service/maintenance/horovod?enable=false")
    assert run_discovery(env).stdout == "127.0.0.1:1\nlocalhost:1\n"

    cluster.stop_node("127.0.0.1")  # serfHealth critical: the node's agent died
    assert run_discovery(env).stdout == "localhost:1\n"
    cluster.start_node("127.0.0.1")


def test_malicious_host_names_never_reach_stdout(cluster, tmp_path):
    local = cluster.addr("localhost")
    bad = ["-oProxyCommand=touch /tmp/pwned", "a;b", "host:1:2", "$(id)", "a b"]
    for i, address in enumerate(bad):
        register(local, f"bad{i}", address=address)
    register(local, "good", address="10.0.0.7", slots="2")
    register(local, "bad-slots", address="10.0.0.8", slots="two")
    env = clean_env(tmp_path, CONSUL_HTTP_ADDR=local)
    result = run_discovery(env, "--host-name", "service-address")
    assert result.returncode == 0
    assert result.stdout == "10.0.0.7:2\n"
    for address in bad:
        assert repr(address) in result.stderr  # warned about, by name
    assert "'two'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == len(bad) + 1


def test_filters_from_flags_and_environment(cluster, tmp_path):
    local, other = cluster.addr("localhost"), cluster.addr("127.0.0.1")
    register(local, slots="8", tags=["a100", "prod"])
    register(other, slots="2", tags=["prod"])
    env = clean_env(tmp_path, CONSUL_HTTP_ADDR=local)
    assert run_discovery(env, "--tag", "a100").stdout == "localhost:8\n"
    capped = run_discovery(env, "--max-slots-per-host", "4")  # 8 slots is invalid data now: dropped, warned
    assert capped.stdout == "127.0.0.1:2\n" and "is 8, above the maximum of 4" in capped.stderr
    assert run_discovery(env, "--exclude", "LOCALHOST").stdout == "127.0.0.1:2\n"
    assert run_discovery(env, "--filter", 'Service.Meta.slots == "2"').stdout == "127.0.0.1:2\n"
    assert run_discovery(env, "--slots-key", "gpus").stdout == ""  # both dropped: no such Meta key
    assert run_discovery(env, "--slots-key", "gpus", "--default-slots", "1").stdout == "127.0.0.1:1\nlocalhost:1\n"
    assert run_discovery(env, "--service", "other").stdout == ""
    env.update(HVD_ELASTIC_TAGS="prod,a100", HVD_ELASTIC_MAX_SLOTS_PER_HOST="7")
    assert run_discovery(env).stdout == ""
    assert run_discovery(env, "--max-slots-per-host", "8").stdout == "localhost:8\n"  # the flag wins


def test_unreachable_consul_fails_fast_with_one_line(tmp_path):
    with refused_address() as nobody:  # held (bound, never listening) while the call runs
        env = clean_env(tmp_path, CONSUL_HTTP_ADDR=nobody)
        assert_failed(run_discovery(env, "--first-call-retry", "0"), 1, "cannot reach Consul")


def test_first_call_retries_a_leaderless_consul_later_calls_do_not(tmp_path):
    hosts = json.dumps([{"Node": {"Node": "n1", "Address": "10.0.0.1"}, "Service": {"ID": "h", "Meta": {"slots": "1"}},
                         "Checks": []}]).encode()

    def respond(call):  # requests 1-2: no leader yet; 3: healthy; 4 on: no leader again
        return (200, hosts) if call.number == 3 else (500, b"No cluster leader")

    with ScriptedServer(respond) as server:
        env = clean_env(tmp_path, CONSUL_HTTP_ADDR=server.addr)
        first = run_discovery(env, "--first-call-retry", "20")
        assert (first.returncode, first.stdout) == (0, "n1:1\n")
        assert len(server.requests) == 3
        later = run_discovery(env, "--first-call-retry", "20")
    # The later call retried only within its own --timeout (0.8 s), not the 20 s window: its back-off
    # (0.05 s doubling) fits at most 5 attempts in 0.8 s however fast the machine, the window dozens.
    assert_failed(later, 1, "500", "No cluster leader", "gave up after")
    assert len(server.requests) - 3 <= 5, server.requests


def test_a_first_call_waits_for_one_slow_answer_a_later_call_does_not(tmp_path):
    hosts = (b'[{"Node": {"Node": "n1", "Address": "10.0.0.1"}, '
             b'"Service": {"ID": "h", "Meta": {"slots": "1"}}, "Checks": []}]')
    slow = threading.Event()

    def respond(call):  # every answer comes 1.5 s late (a large service on a loaded Consul)
        slow.wait(1.5)
        return 200, hosts

    with ScriptedServer(respond) as server:
        env = clean_env(tmp_path, CONSUL_HTTP_ADDR=server.addr)
        first = run_discovery(env)  # --timeout 0.8, --first-call-retry 10
        assert (first.returncode, first.stdout) == (0, "n1:1\n"), first.stderr
        assert len(server.requests) == 1  # one attempt, given the time, not a retry per 0.8 s
        assert_failed(run_discovery(env), 1, "did not answer")


def test_acl_token_is_required_and_the_flag_wins(tmp_path, consul_kind):
    with consul_cluster(consul_kind, ["localhost"], acl_token="s3cret") as secured:
        addr = secured.addr("localhost")
        register(addr, slots="2", token="s3cret")
        env = clean_env(tmp_path, CONSUL_HTTP_ADDR=addr)
        assert_failed(run_discovery(env), 1, "enforces ACLs", "CONSUL_HTTP_TOKEN")
        assert_failed(run_discovery(dict(env, CONSUL_HTTP_TOKEN="wrong")), 1, "403")
        assert run_discovery(dict(env, CONSUL_HTTP_TOKEN="s3cret")).stdout == "localhost:2\n"
        assert run_discovery(dict(env, CONSUL_HTTP_TOKEN="wrong"), "--token", "s3cret").stdout == "localhost:2\n"
        token_file = tmp_path / "token"
        token_file.write_text("s3cret\n")
        assert run_discovery(dict(env, CONSUL_HTTP_TOKEN_FILE=str(token_file))).stdout == "localhost:2\n"
        # A rejected token is never echoed, from the environment or from the flag.
        for result in (run_discovery(dict(env, CONSUL_HTTP_TOKEN="wr0ng-t0ken")),
                       run_discovery(env, "--token", "wr0ng-t0ken")):
            assert result.returncode == 1 and "403" in result.stderr
            assert "wr0ng-t0ken" not in result.stderr + result.stdout


@pytest.mark.parametrize(
    "status,body,needle",
    [
        (200, b"<html>not json</html>", "not JSON"),
        (200, b'{"Node": "x"}', "malformed"),
        (200, b'[{"Node": {"Node": "n1"}, "Service": {}, "Checks": 3}]', "malformed"),
        (503, b"upstream down", "503"),
        (400, b"bad filter", "400"),
    ],
)
def test_garbage_and_errors_print_nothing(tmp_path, status, body, needle):
    with ScriptedServer(lambda call: (status, body)) as server:
        env = clean_env(tmp_path, CONSUL_HTTP_ADDR=server.addr)
        assert_failed(run_discovery(env, "--first-call-retry", "0"), 1, needle)


def test_a_silent_consul_is_cut_off_by_the_timeout(tmp_path):
    with ScriptedServer(lambda call: None) as server:
        env = clean_env(tmp_path, CONSUL_HTTP_ADDR=server.addr)
        assert_failed(run_discovery(env, "--timeout", "0.5", "--first-call-retry", "0"), 1, "did not answer")


@pytest.mark.parametrize(
    "args,env_extra,needle",
    [
        (["--timeout", "0"], {}, "--timeout"),
        (["--max-slots-per-host", "-2"], {}, "--max-slots-per-host"),
        (["--host-name", "fqdn"], {}, "--host-name"),
        ([], {"HVD_ELASTIC_HOST_NAME": "fqdn"}, "'fqdn' is not one of node, service-address, node-address"),
        ([], {"HVD_ELASTIC_DEFAULT_SLOTS": "zero"}, "--default-slots"),
        (["--max-slots-per-host", "0"], {}, "'0' is not a positive integer"),
        (["--cache", "sometimes"], {}, "'sometimes' is not one of auto, on, off"),
        ([], {"HVD_ELASTIC_DISCOVERY_CACHE": "sometimes"}, "'sometimes' is not one of auto, on, off"),
        (["--stale=perhaps"], {}, "'perhaps' is not a boolean"),
        ([], {"HVD_ELASTIC_STALE": "perhaps"}, "'perhaps' is not a boolean"),
        (["--max-stale", "0"], {}, "--max-stale"),
        (["--watch-wait", "-1"], {}, "--watch-wait"),
        (["--cache-max-age", "0"], {}, "--cache-max-age"),
        (["--watch"], {}, "--watch needs --cache-file"),
        (["--watch", "--cache-file", "/nonexistent/dir/hosts"], {}, "'/nonexistent/dir' does not exist"),
        ([], {"CONSUL_HTTP_ADDR": "127.0.0.1:notaport"}, "CONSUL_HTTP_ADDR"),
        ([], {"CONSUL_HTTP_SSL": "maybe"}, "CONSUL_HTTP_SSL"),
        (["--client-cert", "/nonexistent.pem"], {}, "CONSUL_CLIENT_KEY"),
        (["--ca-file", "/nonexistent.pem"], {"CONSUL_HTTP_ADDR": "https://127.0.0.1:1"},
         "--ca-file='/nonexistent.pem' cannot be read"),
    ],
)
def test_bad_input_exits_2(tmp_path, args, env_extra, needle):
    result = run_discovery(clean_env(tmp_path, **env_extra), *args)
    assert result.returncode == 2, result
    assert result.stdout == ""
    assert needle in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr  # one line, no usage block


def test_tls_with_ca_file(tmp_path, consul_kind):
    cert, key = self_signed_cert(tmp_path)
    with consul_cluster(consul_kind, ["localhost"], tls_cert=str(cert), tls_key=str(key)) as secured:
        addr = secured.addr("localhost")
        register_tls = {"Name": "horovod", "Meta": {"slots": "1"}, "Check": {"TTL": "300s", "Status": "passing"}}
        env = clean_env(tmp_path, CONSUL_HTTP_ADDR=f"https://{addr}")
        assert_failed(run_discovery(env, "--first-call-retry", "0"), 1, "TLS")
        ok = run_discovery(dict(env, CONSUL_CACERT=str(cert)))
        assert (ok.returncode, ok.stdout) == (0, ""), ok.stderr  # no service yet: an empty, valid list
        insecure = run_discovery(dict(env, CONSUL_HTTP_SSL_VERIFY="false"))
        assert insecure.returncode == 0, insecure.stderr
        import ssl
        import urllib.request

        request = urllib.request.Request(f"https://{addr}/v1/agent/service/register",
                                         data=json.dumps(register_tls).encode(), method="PUT")
        urllib.request.urlopen(request, context=ssl.create_default_context(cafile=str(cert)), timeout=10).read()
        assert run_discovery(env, "--ca-file", str(cert)).stdout == "localhost:1\n"


HOSTS_JSON = (b'[{"Node": {"Node": "n1", "Address": "10.0.0.1"}, '
              b'"Service": {"ID": "h", "Meta": {"slots": "2"}}, "Checks": []}]')


def _chunked(body: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:10], body[10:])) + b"0\r\n\r\n"


@pytest.mark.parametrize(
    "answer,keep_open",
    [
        # stops at Content-Length
        (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(HOSTS_JSON), HOSTS_JSON), True),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(HOSTS_JSON), False),
        # stops at the last chunk: found through a proxy in front of real Consul, which chunks answers over 2 KiB
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(HOSTS_JSON), True),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(HOSTS_JSON)[:-2] + b"X-T: 1\r\n\r\n",
         True),
        (b"HTTP/1.0 200 OK\r\n\r\n" + HOSTS_JSON, False),  # delimited by the end of the connection
    ],
)
def test_transport_body_framings(tmp_path, answer, keep_open):
    with RawServer(answer, keep_open=keep_open) as server:
        # The server keeps the connection open 10 s: the call must not wait for it to close.
        result = run_discovery(clean_env(tmp_path, CONSUL_HTTP_ADDR=server.addr), "--timeout", "5",
                               "--first-call-retry", "0")
    assert (result.returncode, result.stdout, result.stderr) == (0, "n1:2\n", "")


@pytest.mark.parametrize(
    "answer,needle",
    [
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not an HTTP status line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 999\r\n\r\n[1, 2", "connection closed after 5 of 999 body bytes"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n[]\r\n0\r\n\r\n", "bad chunk size"),
        (b"", "connection closed without an answer"),
    ],
)
def test_transport_bad_answers_print_nothing(tmp_path, answer, needle):
    with RawServer(answer) as server:
        assert_failed(run_discovery(clean_env(tmp_path, CONSUL_HTTP_ADDR=server.addr), "--first-call-retry", "0"), 1,
                      needle)


def test_a_token_with_a_newline_is_bad_input_not_a_header_injection(tmp_path):
    with ScriptedServer(lambda call: (200, b"[]")) as server:
        result = run_discovery(clean_env(tmp_path, CONSUL_HTTP_ADDR=server.addr, CONSUL_HTTP_TOKEN="abc\r\nX-Evil: 1"))
        assert server.requests == []
    assert result.returncode == 2 and "control characters" in result.stderr and "abc" not in result.stderr
