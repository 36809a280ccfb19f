"""The token guard (issue 14): no Consul ACL token where horovodrun shows it to other users.

Real processes over real HTTP: discovery runs under a stand-in ``horovodrun``
(a script of that name that starts the discovery command through Horovod's own
``safe_shell_exec``, exactly as horovodrun's driver does) against a dev Consul
with ACLs.  The rules themselves and the doctor's finding are tested directly.
The multi-host proof (ssh, /proc of every worker host) is
``tests/multihost/test_token_safety.py``.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from consul_testing import clean_env, consul_request, register, run_discovery

from hvd_elastic.commands import doctor
from hvd_elastic.cli import build_parser
from hvd_elastic.consul.config import ConfigError
from hvd_elastic.devagent import DevCluster
from hvd_elastic.discovery import token_guard
from testbed import HVD_ELASTIC, child_env, start_node_agent, wait_until
from testbed.env import CONSUL_HOSTS

TOKEN = f"tok-{uuid.uuid4().hex}"
REFUSAL = "refusing to run under horovodrun"
ALLOW = token_guard.ALLOW_ENV

STAND_IN = f"""#!{sys.executable}
import io, sys
from horovod.runner.common.util import safe_shell_exec
if __name__ == "__main__":  # safe_shell_exec's middleman is a spawned multiprocessing child
    out, err = io.StringIO(), io.StringIO()
    code = safe_shell_exec.execute(sys.argv[1], stdout=out, stderr=err)
    sys.stdout.write(out.getvalue())
    sys.stderr.write(err.getvalue())
    sys.exit(code)
"""


@pytest.fixture(scope="module")
def secured():
    """A dev Consul with ACLs on and one service instance (2 slots) on node ``localhost``."""
    with DevCluster(nodes=["localhost"], acl_token=TOKEN) as cluster:
        register(cluster.addr("localhost"), slots="2", token=TOKEN)
        yield cluster


@pytest.fixture
def env(secured, tmp_path):
    # No host cache: these calls start no watcher that could outlive the test.
    return clean_env(tmp_path, CONSUL_HTTP_ADDR=secured.addr("localhost"), HVD_ELASTIC_DISCOVERY_CACHE="off")


@pytest.fixture
def horovodrun(tmp_path):
    """``horovodrun(env, command)``: run ``command`` as horovodrun runs its discovery script."""
    script = tmp_path / "bin" / "horovodrun"
    script.parent.mkdir()
    script.write_text(STAND_IN)
    script.chmod(0o755)

    def run(env: dict[str, str], command: str):
        return subprocess.run([str(script), command], env=env, capture_output=True, text=True, timeout=60)

    return run


def token_file(tmp_path: Path, mode: int = 0o600) -> Path:
    path = tmp_path / "consul-token"
    path.write_text(TOKEN + "\n")
    path.chmod(mode)
    return path


def assert_refused(result, *needles: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and REFUSAL in lines[0], result.stderr
    for needle in ("CONSUL_HTTP_TOKEN_FILE", f"{ALLOW}=1", *needles):
        assert needle in lines[0], (needle, lines[0])
    assert TOKEN not in result.stderr


def test_the_rules():
    assert "CONSUL_HTTP_TOKEN" in token_guard.exposure({"CONSUL_HTTP_TOKEN": "x"}, token_flag=False)[0]
    assert "--token" in token_guard.exposure({}, token_flag=True)[0]
    assert token_guard.exposure({"CONSUL_HTTP_TOKEN": "", "CONSUL_HTTP_TOKEN_FILE": "/t"}, token_flag=False) is None
    assert [token_guard.allowed({ALLOW: v}) for v in ("1", "true", "0", "")] == [True, True, False, False]
    assert token_guard.allowed({}) is False
    with pytest.raises(ConfigError, match=f"{ALLOW}='yes' is not a boolean"):
        token_guard.allowed({ALLOW: "yes"})


@pytest.mark.parametrize("how", ["environment", "flag", "hvd-elastic discover"])
def test_an_exposed_token_is_refused_under_horovodrun(env, horovodrun, how):
    if how == "flag":
        result = horovodrun(env, f"{CONSUL_HOSTS} --token {TOKEN}")
        assert_refused(result, "--token-file")
    else:
        command = f"{HVD_ELASTIC} discover" if how == "hvd-elastic discover" else str(CONSUL_HOSTS)
        assert_refused(horovodrun(dict(env, CONSUL_HTTP_TOKEN=TOKEN), command), "unset CONSUL_HTTP_TOKEN")


def test_a_wrapper_in_its_own_session_does_not_hide_horovodrun(env, horovodrun):
    # The call's session leader is then setsid's child, whose parent is no horovodrun.
    assert_refused(horovodrun(dict(env, CONSUL_HTTP_TOKEN=TOKEN), f"setsid --wait {CONSUL_HOSTS}"))


def test_the_token_file_and_the_opt_in_run_under_horovodrun(env, horovodrun, tmp_path):
    safe = horovodrun(dict(env, CONSUL_HTTP_TOKEN_FILE=str(token_file(tmp_path))), str(CONSUL_HOSTS))
    assert (safe.returncode, safe.stdout, safe.stderr) == (0, "localhost:2\n", "")
    opted = dict(env, CONSUL_HTTP_TOKEN=TOKEN, **{ALLOW: "1"})
    for command in (str(CONSUL_HOSTS), f"{HVD_ELASTIC} discover"):
        result = horovodrun(opted, command)
        assert (result.returncode, result.stdout) == (0, "localhost:2\n"), result.stderr
    result = horovodrun(dict(env, **{ALLOW: "1"}), f"{CONSUL_HOSTS} --token {TOKEN}")
    assert (result.returncode, result.stdout) == (0, "localhost:2\n"), result.stderr


def test_outside_horovodrun_the_environment_token_still_works(env):
    # Other launchers, scripts, a person at a terminal: nothing copies this environment elsewhere.
    assert run_discovery(dict(env, CONSUL_HTTP_TOKEN=TOKEN)).stdout == "localhost:2\n"


def test_a_token_file_open_to_others_warns_like_ssh(env, tmp_path):
    path = token_file(tmp_path, 0o644)
    result = run_discovery(dict(env, CONSUL_HTTP_TOKEN_FILE=str(path)))
    assert (result.returncode, result.stdout) == (0, "localhost:2\n")
    assert result.stderr.splitlines() == [f"CONSUL_HTTP_TOKEN_FILE={str(path)!r} is open to other users (mode 0644): "
                                          f"run chmod 600 {path}"]
    path.chmod(0o600)
    assert run_discovery(dict(env, CONSUL_HTTP_TOKEN_FILE=str(path))).stderr == ""


def test_the_doctor_reports_the_same_finding(monkeypatch, tmp_path):
    assert doctor.check_token in doctor.CHECKS["horovodrun"]
    args = build_parser(only="doctor").parse_args(["doctor"])  # no --token, no --token-file
    for name in ("CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE", ALLOW):
        monkeypatch.delenv(name, raising=False)
    assert doctor.check_token(args).label == "ok"
    monkeypatch.setenv("CONSUL_HTTP_TOKEN", TOKEN)
    finding = doctor.check_token(args)
    assert (finding.label, finding.required) == ("FAIL", True)
    assert ("refuses to run" in finding.line() and "CONSUL_HTTP_TOKEN_FILE" in finding.line()
            and TOKEN not in finding.line())
    monkeypatch.setenv(ALLOW, "1")
    assert doctor.check_token(args).label == "warn"
    monkeypatch.setenv(ALLOW, "yes")
    assert "'yes' is not a boolean" in doctor.check_token(args).line()
    monkeypatch.delenv("CONSUL_HTTP_TOKEN")
    monkeypatch.delenv(ALLOW)
    monkeypatch.setenv("CONSUL_HTTP_TOKEN_FILE", str(token_file(tmp_path, 0o640)))
    assert doctor.check_token(args).label == "warn" and "mode 0640" in doctor.check_token(args).line()
    token_file(tmp_path).chmod(0o600)
    assert doctor.check_token(args).label == "ok"


def test_the_bed_and_the_demo_never_hand_a_token_to_their_children():
    base = {"CONSUL_HTTP_ADDR": "10.0.0.1:8500", "CONSUL_HTTP_TOKEN": TOKEN, "CONSUL_HTTP_TOKEN_FILE": "/t",
            "PATH": "/bin"}
    for scrub in (True, False):
        env = child_env(base, scrub=scrub)
        assert "CONSUL_HTTP_TOKEN" not in env and "CONSUL_HTTP_TOKEN_FILE" not in env
    assert child_env(base, scrub=False)["CONSUL_HTTP_ADDR"] == "10.0.0.1:8500"


def test_no_log_or_output_holds_the_token(secured, env, tmp_path, caplog):
    """The node agent's log, ``status`` and discovery's errors, the dev agent's request log."""
    addr = secured.addr("localhost")
    safe = dict(env, CONSUL_HTTP_TOKEN_FILE=str(token_file(tmp_path)))
    agent = start_node_agent("--service", "other", "--slots", "1", "--probe", "memory", "--min-free-memory", "1K",
                             env=safe, logdir=tmp_path / "logs", name="node-agent")
    try:
        agent.wait_until("the agent to register", lambda: "registered service" in agent.read_log(), 60)
    finally:
        agent.stop()
    outputs = [agent.read_log()]
    for command_env in (safe, dict(env, CONSUL_HTTP_TOKEN=TOKEN + "x")):  # right token from a file, wrong one
        status = subprocess.run([str(HVD_ELASTIC), "status"], env=command_env, capture_output=True, text=True,
                                timeout=60)
        outputs.append(status.stdout + status.stderr)
    assert "localhost" in outputs[1] and "403" in outputs[2], outputs
    with caplog.at_level(logging.DEBUG, logger="hvd_elastic.devagent"):
        assert consul_request(addr, "GET", f"/v1/agent/self?token={TOKEN}")[0] == 200  # Consul's deprecated way
        assert consul_request(addr, "GET", "/v1/agent/self", token=TOKEN + "x")[0] == 403
        wait_until("the dev agent to log the requests", lambda: "/v1/agent/self" in caplog.text, 10)
    outputs.append(caplog.text)
    for text in outputs:
        assert TOKEN not in text
