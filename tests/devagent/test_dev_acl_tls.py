"""ACL enforcement (default deny with a management token) and HTTPS serving."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request

import consul
import pytest
import requests
from devagent_helpers import Raw, client

from hvd_elastic.consul.config import ConsulConfig
from hvd_elastic.devagent import DevCluster

TOKEN = "5e2b1c1e-0d9f-4c43-9c1e-acl-test-token"


@pytest.fixture(scope="module")
def acl_cluster():
    with DevCluster(nodes=["localhost", "127.0.0.1"], acl_token=TOKEN) as c:
        yield c


def test_token_via_header_bearer_and_query_param(acl_cluster):
    raw = Raw(acl_cluster.addr("localhost"))
    body = {"Name": "secured", "Check": {"TTL": "30s"}}
    assert raw.request("PUT", "/v1/agent/service/register", body, {"X-Consul-Token": TOKEN})[0] == 200
    assert raw.request("GET", "/v1/agent/services", headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200
    assert raw.request("GET", f"/v1/health/service/secured?token={TOKEN}")[0] == 200
    c = client(acl_cluster, "localhost", token=TOKEN)
    assert "secured" in c.agent.services()
    assert len(c.health.service("secured")[1]) == 1


def test_unknown_token_is_acl_not_found(acl_cluster):
    raw = Raw(acl_cluster.addr("127.0.0.1"))
    for method, path in [("GET", "/v1/health/service/secured"), ("PUT", "/v1/kv/x"), ("GET", "/v1/agent/self")]:
        status, _, body = raw.request(method, path, headers={"X-Consul-Token": "wrong"})
        assert (status, body) == (403, b"ACL not found"), path
    with pytest.raises(consul.ACLPermissionDenied):
        client(acl_cluster, "127.0.0.1", token="wrong").kv.put("k", "v")


def test_anonymous_is_denied_writes_and_sees_empty_listings(acl_cluster):
    raw = Raw(acl_cluster.addr("localhost"))
    status, _, body = raw.request("PUT", "/v1/agent/service/register", {"Name": "anon"})
    assert status == 403 and body.startswith(b"Permission denied: anonymous token lacks permission 'service:write'")
    assert raw.request("PUT", "/v1/kv/anon", b"x")[0] == 403
    entries, headers = raw.json("GET", "/v1/health/service/secured")
    assert entries == [] and "x-consul-index" in headers
    assert raw.json("GET", "/v1/agent/services")[0] == {}
    with pytest.raises(consul.ACLPermissionDenied):
        client(acl_cluster, "localhost").agent.service.register("anon")


def test_status_endpoints_need_no_token(acl_cluster):
    raw = Raw(acl_cluster.addr("localhost"))
    assert raw.json("GET", "/v1/status/leader")[0] == "127.0.0.1:8300"


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl binary is needed to make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True,
    )
    return str(cert), str(key)


def test_https_with_ca_verification(tls_files):
    cert, key = tls_files
    with DevCluster(nodes=["gpu-a"], tls_cert=cert, tls_key=key) as cluster:
        host, port = cluster.addr("gpu-a").rsplit(":", 1)
        assert cluster.url("gpu-a").startswith("https://")
        c = consul.Consul(host=host, port=int(port), scheme="https", verify=cert)
        assert c.status.leader() == "127.0.0.1:8300"
        c.agent.service.register("tls-svc", check=consul.Check.ttl("30s"))
        assert len(c.health.service("tls-svc")[1]) == 1
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(f"https://{host}:{port}/v1/status/leader", timeout=5)  # default CA store rejects it
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(f"http://{host}:{port}/v1/status/leader", timeout=5)  # plain HTTP is not served


def test_consul_env_tls_and_token_paths(tls_files):
    """CONSUL_HTTP_ADDR=https://..., CONSUL_CACERT and CONSUL_HTTP_TOKEN, as the project's clients read them."""
    cert, key = tls_files
    with DevCluster(nodes=["gpu-a"], tls_cert=cert, tls_key=key, acl_token=TOKEN) as cluster:
        env = {"CONSUL_HTTP_ADDR": f"https://{cluster.addr('gpu-a')}", "CONSUL_CACERT": cert,
               "CONSUL_HTTP_TOKEN": TOKEN}
        cfg = ConsulConfig.from_env(env)
        request = urllib.request.Request(f"{cfg.base_url}/v1/agent/self", headers={"X-Consul-Token": cfg.token})
        with urllib.request.urlopen(request, context=cfg.ssl_context(), timeout=10) as resp:
            assert json.load(resp)["Config"]["NodeName"] == "gpu-a"
        insecure = ConsulConfig.from_env({**env, "CONSUL_CACERT": "", "CONSUL_HTTP_SSL_VERIFY": "false"})
        with urllib.request.urlopen(f"{insecure.base_url}/v1/status/leader", context=insecure.ssl_context(),
                                    timeout=10) as resp:
            assert json.load(resp) == "127.0.0.1:8300"
