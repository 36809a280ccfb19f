"""ConsulConfig reads the CONSUL_HTTP_* variables the way Consul's own tools do."""

from __future__ import annotations

import pytest

from hvd_elastic.consul.config import ConfigError, ConsulConfig, parse_bool


def test_defaults():
    cfg = ConsulConfig.from_env({})
    assert (cfg.scheme, cfg.host, cfg.port, cfg.token, cfg.verify) == ("http", "127.0.0.1", 8500, None, True)
    assert cfg.base_url == "http://127.0.0.1:8500"
    assert cfg.ssl_context() is None


@pytest.mark.parametrize("addr, expected", [
    ("consul.service:8501", ("http", "consul.service", 8501)),
    ("https://10.0.0.1:8501", ("https", "10.0.0.1", 8501)),
    ("http://node1", ("http", "node1", 8500)),
    ("https://node1", ("https", "node1", 443)),
    ("node1", ("http", "node1", 8500)),
    ("[::1]:8500", ("http", "::1", 8500)),
])
def test_address_forms(addr, expected):
    cfg = ConsulConfig.from_env({"CONSUL_HTTP_ADDR": addr})
    assert (cfg.scheme, cfg.host, cfg.port) == expected


def test_ssl_variable_switches_scheme():
    assert ConsulConfig.from_env({"CONSUL_HTTP_ADDR": "n:8501", "CONSUL_HTTP_SSL": "true"}).scheme == "https"
    assert ConsulConfig.from_env({"CONSUL_HTTP_SSL": "0"}).scheme == "http"


@pytest.mark.parametrize("env, message", [
    ({"CONSUL_HTTP_ADDR": "unix:///tmp/consul.sock"}, "scheme 'unix' is not supported"),
    ({"CONSUL_HTTP_ADDR": "node:http"}, "port 'http' is not a number"),
    ({"CONSUL_HTTP_ADDR": "node:70000"}, "port 70000 is out of range"),
    ({"CONSUL_HTTP_ADDR": ":8500"}, "has no host"),
    ({"CONSUL_HTTP_SSL": "yes"}, "CONSUL_HTTP_SSL='yes' is not a boolean"),
    ({"CONSUL_HTTP_SSL_VERIFY": "nope"}, "CONSUL_HTTP_SSL_VERIFY='nope' is not a boolean"),
    ({"CONSUL_CLIENT_CERT": "/c.pem"}, "CONSUL_CLIENT_CERT is set without CONSUL_CLIENT_KEY"),
    ({"CONSUL_HTTP_ADDR": "http://node:abc"}, "CONSUL_HTTP_ADDR='http://node:abc': port 'abc' is not a number"),
    ({"CONSUL_HTTP_ADDR": "https://node:99999"}, "CONSUL_HTTP_ADDR='https://node:99999': port 99999 is out of range"),
    ({"CONSUL_HTTP_TOKEN_FILE": "/nonexistent/token"}, "CONSUL_HTTP_TOKEN_FILE='/nonexistent/token' cannot be read"),
])
def test_bad_values_are_named(env, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ConsulConfig.from_env(env)


def test_token_precedence(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    env = {"CONSUL_HTTP_TOKEN": "from-env", "CONSUL_HTTP_TOKEN_FILE": str(token_file)}
    assert ConsulConfig.from_env(env).token == "from-env"
    assert ConsulConfig.from_env({"CONSUL_HTTP_TOKEN_FILE": str(token_file)}).token == "from-file"
    assert ConsulConfig.from_env(env, token_file=str(token_file)).token == "from-file"
    assert ConsulConfig.from_env(env, token="explicit", token_file=str(token_file)).token == "explicit"


def test_token_is_never_shown():
    cfg = ConsulConfig.from_env({"CONSUL_HTTP_TOKEN": "s3cr3t-token"})
    assert "s3cr3t" not in repr(cfg) and "s3cr3t" not in str(cfg)
    assert "token=set" in repr(cfg)


def test_verify_settings():
    cfg = ConsulConfig.from_env({"CONSUL_HTTP_ADDR": "https://n:8501", "CONSUL_HTTP_SSL_VERIFY": "false"})
    assert cfg.verify is False
    ctx = cfg.ssl_context()
    assert ctx is not None and ctx.check_hostname is False
    assert ConsulConfig.from_env({"CONSUL_CACERT": "/ca.pem"}).ca_file == "/ca.pem"


def test_unreadable_tls_files_are_a_config_error_naming_them(tmp_path):
    missing = str(tmp_path / "missing.pem")
    cfg = ConsulConfig.from_env({"CONSUL_HTTP_ADDR": "https://n:8501", "CONSUL_CACERT": missing})
    with pytest.raises(ConfigError) as info:
        cfg.ssl_context()
    assert str(info.value) == f"CONSUL_CACERT={missing!r} cannot be read: No such file or directory"
    cfg = ConsulConfig.from_env({"CONSUL_HTTP_ADDR": "https://n:8501"}, ca_file=missing)
    with pytest.raises(ConfigError, match=r"^--ca-file='"):
        cfg.ssl_context()


@pytest.mark.parametrize("text, value", [("1", True), ("T", True), ("True", True), ("0", False), ("F", False)])
def test_parse_bool_like_go(text, value):
    assert parse_bool("X", text) is value


def test_a_token_from_a_file_remembers_the_file_and_follows_its_rotation(tmp_path, monkeypatch):
    path = tmp_path / "token"
    path.write_text("first\n")
    path.chmod(0o600)
    monkeypatch.chdir(tmp_path)
    cfg = ConsulConfig.from_env({"CONSUL_HTTP_TOKEN_FILE": "token"})
    assert (cfg.token, cfg.token_file) == ("first", str(path))  # absolute: a child may run elsewhere
    assert cfg.with_fresh_token() is cfg
    path.write_text("second\n")
    assert cfg.with_fresh_token().token == "second" and cfg.token == "first"
    path.unlink()
    with pytest.raises(ConfigError, match="cannot be read"):
        cfg.with_fresh_token()


def test_a_token_value_has_no_file_to_follow():
    cfg = ConsulConfig.from_env({"CONSUL_HTTP_TOKEN": "value"})
    assert cfg.token_file is None and cfg.with_fresh_token() is cfg
    assert "token_file" not in repr(cfg)
