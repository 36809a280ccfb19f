"""Bad input to the commands: one stderr line, ``PROG: error: ...``, naming the bad value, what was expected and
the flag or variable that actually set it; exit 2 for bad input, 1 for what Consul refuses or fails.  Never a
traceback, never a silent empty answer.

The commands run in this process (:func:`hvd_elastic.cli.main`) against an in-process dev agent; discovery's own
script and the long-running watcher run as processes, as horovodrun and systemd start them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from hvd_elastic.cli import build_parser
from hvd_elastic.cli import main as cli_main
from hvd_elastic.consul import api
from hvd_elastic.consul.config import ConsulConfig
from hvd_elastic.devagent import DevCluster
from hvd_elastic.local.realconsul import consul_cluster
from testbed import CONSUL_HOSTS, HVD_ELASTIC, child_env
from testbed.consul import refused_address

ADDRESS_ERROR = {
    "http://127.0.0.1:abc": "port 'abc' is not a number (expected host:port or http[s]://host:port)",
    "http://h:99999": "port 99999 is out of range (expected 1-65535)",
}


@pytest.fixture
def cli(monkeypatch, capsys, tmp_path):
    """``cli(*argv, **env)`` -> (exit code, stdout, stderr): hvd-elastic in this process, with exactly ``env``
    among the CONSUL_* and HVD_ELASTIC_* variables."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)

    def run(*argv: str, **env: str) -> tuple[int, str, str]:
        for name in list(os.environ):
            if name.startswith(("CONSUL_", "HVD_ELASTIC_")):
                monkeypatch.delenv(name)
        monkeypatch.setenv("HVD_ELASTIC_DISCOVERY_STATE_DIR", str(state))
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        try:
            code = cli_main(list(argv))
        except SystemExit as exc:
            code = exc.code
        out, err = capsys.readouterr()
        assert "Traceback" not in err, err
        return code, out, err

    return run


@pytest.fixture(scope="module")
def agent():
    """A dev agent with service ``horovod`` (tag ``cpu``) registered, passing."""
    with DevCluster(nodes=["gpu-a"]) as cluster:
        addr = cluster.addr("gpu-a")
        api.register_service(ConsulConfig.from_env({}, addr=addr), {
            "Name": "horovod", "ID": "horovod", "Tags": ["cpu"], "Meta": {"slots": "2"},
            "Check": {"TTL": "300s", "Status": "passing"}})
        yield addr


def one_error_line(err: str, prog: str) -> str:
    """The message of the single error line ``err`` holds (asserting that it is one)."""
    assert err.count("\n") == 1 and err.startswith(f"{prog}: error: "), err
    return err[len(prog) + len(": error: "):-1]


# -- CONSUL_HTTP_ADDR / --http-addr with a bad port -------------------------------------------------------------------


@pytest.mark.parametrize("addr", sorted(ADDRESS_ERROR))
@pytest.mark.parametrize("command", [["discover", "--cache", "off"], ["status"], ["drain"], ["undrain"],
                                     ["node-agent"]])
def test_a_bad_consul_address_is_one_line_naming_the_variable(cli, command, addr):
    code, out, err = cli(*command, CONSUL_HTTP_ADDR=addr)
    assert (code, out) == (2, "")
    assert one_error_line(err, f"hvd-elastic {command[0]}") == f"CONSUL_HTTP_ADDR={addr!r}: {ADDRESS_ERROR[addr]}"


@pytest.mark.parametrize("addr", sorted(ADDRESS_ERROR))
def test_a_bad_http_addr_flag_is_named_as_the_flag(cli, addr):
    code, _, err = cli("status", "--http-addr", addr, CONSUL_HTTP_ADDR="127.0.0.1:8500")
    assert code == 2
    assert one_error_line(err, "hvd-elastic status") == f"--http-addr={addr!r}: {ADDRESS_ERROR[addr]}"


@pytest.mark.parametrize("addr", sorted(ADDRESS_ERROR))
def test_the_discovery_script_keeps_its_contract_on_a_bad_address(addr, tmp_path):
    """discovery/README.md: exit 2 and one line for bad settings, stdout empty (horovodrun reads it)."""
    out = subprocess.run([sys.executable, str(CONSUL_HOSTS)], capture_output=True, text=True, timeout=60,
                         env=child_env(discovery_state=tmp_path, CONSUL_HTTP_ADDR=addr))
    assert (out.returncode, out.stdout) == (2, "")
    assert one_error_line(out.stderr, "consul_hosts") == f"CONSUL_HTTP_ADDR={addr!r}: {ADDRESS_ERROR[addr]}"


# -- a variable's bad value names the variable, a flag's the flag ------------------------------------------------------


def test_a_bad_log_level_variable_names_it_and_the_subcommand(cli):
    code, _, err = cli("status", HVD_ELASTIC_LOG_LEVEL="trace")
    assert code == 2
    assert one_error_line(err, "hvd-elastic status") == (
        "HVD_ELASTIC_LOG_LEVEL (the default of --log-level): 'trace' is not a log level (DEBUG, INFO, WARNING, ERROR)")


def test_log_levels_are_read_in_any_case():
    assert build_parser(only="status").parse_args(["--log-level", "debug", "status"]).log_level == "DEBUG"


@pytest.mark.parametrize("argv, env, expected", [
    (["node-agent"], {"HVD_ELASTIC_TTL": "abc"},
     "HVD_ELASTIC_TTL (the default of --ttl): 'abc' is not a duration of at least 1s"),
    (["node-agent", "--ttl", "abc"], {"HVD_ELASTIC_TTL": "15"},
     "argument --ttl: 'abc' is not a duration of at least 1s"),
    (["discover"], {"HVD_ELASTIC_DISCOVERY_TIMEOUT": "soon"},
     "HVD_ELASTIC_DISCOVERY_TIMEOUT (the default of --timeout): 'soon' is not a positive duration"),
    (["discover", "--timeout=0s"], {}, "argument --timeout: '0s' is not a positive duration"),
])
def test_the_setting_actually_used_is_the_one_named(cli, argv, env, expected):
    code, _, err = cli(*argv, **env)
    assert code == 2
    assert one_error_line(err, f"hvd-elastic {argv[0]}").startswith(expected), err


# -- TLS ------------------------------------------------------------------------------------------------------------


def test_an_unreadable_tls_file_is_named_with_its_path(cli, tmp_path):
    missing = str(tmp_path / "ca.pem")
    code, _, err = cli("status", "--http-addr", "https://127.0.0.1:8501", "--ca-file", missing)
    assert code == 2
    message = one_error_line(err, "hvd-elastic status")
    assert message == f"--ca-file={missing!r} cannot be read: No such file or directory"
    code, _, err = cli("status", CONSUL_HTTP_ADDR="https://127.0.0.1:8501", CONSUL_CACERT=missing)
    assert one_error_line(err, "hvd-elastic status").startswith(f"CONSUL_CACERT={missing!r} cannot be read")


def test_a_ca_file_that_holds_no_certificate_is_named(cli, tmp_path):
    junk = tmp_path / "ca.pem"
    junk.write_text("not a certificate\n")
    code, _, err = cli("status", "--http-addr", "https://127.0.0.1:8501", "--ca-file", str(junk))
    assert code == 2
    message = one_error_line(err, "hvd-elastic status")
    assert message.startswith(f"--ca-file={str(junk)!r} holds no usable CA certificate")


def test_a_client_certificate_without_its_key_names_both_settings(cli, tmp_path):
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    code, _, err = cli("status", "--client-cert", str(cert), CONSUL_HTTP_ADDR="https://127.0.0.1:8501")
    assert code == 2
    assert one_error_line(err, "hvd-elastic status").startswith(
        "--client-cert is set without CONSUL_CLIENT_KEY: a client certificate needs its key")


def test_https_to_a_plain_http_agent_says_so(cli, agent):
    code, out, err = cli("status", "--http-addr", f"https://{agent}")
    assert (code, out) == (1, "")
    message = one_error_line(err, "hvd-elastic status")
    assert message.startswith(f"TLS with Consul at https://{agent} failed: ")
    assert message.endswith(f"the agent at port {agent.rsplit(':', 1)[1]} answers plain HTTP, not HTTPS: use http:// "
                            "in --http-addr (and unset CONSUL_HTTP_SSL), or the agent's HTTPS port"), message


# -- what Consul refuses or does not have ------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["discover", "status"])
def test_a_filter_consul_refuses_is_bad_input_naming_the_setting(cli, agent, command):
    code, out, err = cli(command, "--cache", "off", "--filter", "x ==", "--http-addr", agent) if command == "discover" \
        else cli(command, "--http-addr", agent, HVD_ELASTIC_FILTER="x ==")
    assert (code, out) == (2, "")
    name = "--filter" if command == "discover" else "HVD_ELASTIC_FILTER"
    message = one_error_line(err, f"hvd-elastic {command}")
    assert message.startswith(f"{name}='x ==' is not a filter expression Consul accepts (Consul at "), message
    assert "Failed to create boolean expression evaluator" in message and "gave up" not in message


def test_a_filter_real_consul_refuses_with_a_500_is_not_an_outage(cli, consul_kind):
    """HashiCorp Consul answers a bad ?filter= on /v1/health/service with a 500: no retrying, exit 2 all the same."""
    with consul_cluster(consul_kind, ["localhost"]) as cluster:
        code, out, err = cli("discover", "--cache", "off", "--http-addr", cluster.addr("localhost"),
                             HVD_ELASTIC_FILTER="Service.Meta.gpu ==")
    assert (code, out) == (2, "")
    message = one_error_line(err, "hvd-elastic discover")
    assert message.startswith("HVD_ELASTIC_FILTER='Service.Meta.gpu ==' is not a filter expression Consul accepts")
    assert "gave up" not in message, message


@pytest.mark.parametrize("argv, env, hint", [
    (["--service", "trainers"], {}, "--service='trainers' is not registered in Consul at http://{agent} "
                                    "(services there: horovod)"),
    ([], {"HVD_ELASTIC_SERVICE": "trainers"}, "HVD_ELASTIC_SERVICE='trainers' is not registered in Consul at "
                                              "http://{agent} (services there: horovod)"),
    (["--tag", "gpu"], {}, "no instance of --service='horovod' carries --tag 'gpu' (its tags: cpu)"),
    ([], {"HVD_ELASTIC_TAGS": "cpu,h100"}, "no instance of --service='horovod' carries HVD_ELASTIC_TAGS 'h100' "
                                           "(its tags: cpu)"),
])
def test_asking_for_what_does_not_exist_says_what_does(cli, agent, argv, env, hint):
    """stdout stays the (empty) host list and the exit 0, as horovodrun needs; stderr says why it is empty."""
    code, out, err = cli("discover", "--cache", "off", "--http-addr", agent, *argv, **env)
    assert (code, out) == (0, "")
    assert err == f"hvd-elastic discover: warning: {hint.format(agent=agent)}; no host to print\n"


def test_a_match_prints_no_warning(cli, agent):
    code, out, err = cli("discover", "--cache", "off", "--http-addr", agent, "--tag", "cpu")
    assert (code, out, err) == (0, "gpu-a:2\n", "")


def test_a_watcher_that_never_reached_consul_says_why(tmp_path):
    """``discover --watch`` started while Consul is unreachable logs why its cache stays empty, at once."""
    with refused_address() as closed:
        proc = subprocess.Popen([HVD_ELASTIC, "discover", "--watch", "--cache-file", str(tmp_path / "hosts"),
                                 "--http-addr", closed], stderr=subprocess.PIPE, text=True,
                                env=child_env(discovery_state=tmp_path))
        try:
            deadline = time.monotonic() + 30
            lines: list[str] = []
            while time.monotonic() < deadline and not any("no answer from Consul yet" in line for line in lines):
                lines.append(proc.stderr.readline())
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    said = [line for line in lines if "no answer from Consul yet" in line]
    assert said and f"cannot reach Consul at http://{closed}: Connection refused; retrying" in said[0], lines


# -- durations: Consul's spelling everywhere, bare numbers stay seconds -----------------------------------------------


def test_durations_take_consuls_spelling_and_bare_seconds(monkeypatch):
    monkeypatch.setenv("HVD_ELASTIC_TTL", "1m")
    args = build_parser(only="node-agent").parse_args(["node-agent", "--interval", "500ms", "--deregister-after", "90",
                                                       "--leave-timeout", "1m30s", "--standby-wait", "2"])
    assert (args.ttl, args.interval, args.deregister_after, args.leave_timeout, args.standby_wait) == (
        60.0, 0.5, "1m30s", 90.0, 2.0)
    args = build_parser(only="discover").parse_args(["discover", "--timeout", "800ms", "--max-stale", "5s",
                                                     "--watch-wait", "1m", "--first-call-retry", "0"])
    assert (args.timeout, args.max_stale, args.watch_wait, args.first_call_retry) == (0.8, 5.0, 60.0, 0.0)
    args = build_parser(only="launch").parse_args(["launch", "--stall-timeout", "10m", "--restart-delay", "2",
                                                   "--", "true"])
    assert (args.stall_timeout, args.restart_delay) == (600.0, 2.0)
    assert build_parser(only="drain").parse_args(["drain", "--wait", "4m30s"]).wait == 270.0


# -- usage errors of other commands -----------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, expected", [
    (["--stall-timeout", "5", "--", "true"], "--stall-timeout 5s needs --progress-file PATH"),
    (["--progress-file", "events.jsonl", "--", "true"], "--progress-file 'events.jsonl' needs --stall-timeout"),
])
def test_launch_names_the_missing_half_of_a_pair(cli, argv, expected):
    code, out, err = cli("launch", *argv)
    assert (code, out) == (2, "")
    message = one_error_line(err, "hvd-elastic launch")
    assert message.startswith(expected) and "None" not in message, message


def test_report_without_matplotlib_is_one_line(cli, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_text('{"event": "start", "time": 1.0, "rank": 0, "size": 1}\n')
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an import of it now fails, as where it is not installed
    monkeypatch.delitem(sys.modules, "hvd_elastic.report.plot", raising=False)
    code, out, err = cli("report", str(run_dir))
    assert code == 1 and out.startswith(f"run {run_dir}")  # the table is printed all the same
    assert one_error_line(err, "hvd-elastic report") == (
        "drawing the picture needs matplotlib (matplotlib is not importable): pip install 'hvd-elastic[demo]', or pass "
        "--no-png for the table alone")
