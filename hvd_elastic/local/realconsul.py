"""HashiCorp Consul on this machine: :class:`ConsulCluster` has :class:`~hvd_elastic.devagent.DevCluster`'s interface.

So the demo runs on either (``hvd-elastic demo --consul``), and one test fixture
runs a suite against both (:func:`consul_cluster`).  The binary is
``consul`` next to the venv's Python, put there by ``scripts/fetch-consul.sh``
(from ``scripts/bootstrap.sh``): Consul 1.8.7, the oldest the project supports.

The layout is production's, on loopback: one server agent (node
``consul-server``, ``-dev``: in memory, its own leader at once) and, for every
node, a client agent joined to it by gossip, with its own HTTP port, node name
and data folder; each node's address is its client agent's, as a GPU node's
node agent talks to its local agent.
Contracts that differ from the dev agent only in time, not in what is seen:

* :meth:`start` returns once every agent answers and the server's catalog has
  every node with ``serfHealth`` passing;
* :meth:`stop_node` SIGKILLs a node's agent (its port closes at once) and
  returns once the server marks the node's ``serfHealth`` critical: gossip's
  failure detection takes a moment where the dev agent flips at once;
* :meth:`start_node` restarts it with the same port, name and data folder (its
  registered services come back from disk, as Consul persists them) and returns
  once it is alive again.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hvd_elastic.consul import api, client
from hvd_elastic.consul.config import ConsulConfig
from hvd_elastic.consul.errors import ConsulError

from . import ports
from .env import VENV_BIN, fetched_binary_missing

#: Where bootstrap puts the binary; ``<CONSUL>.unavailable`` holds why it could not.
CONSUL = VENV_BIN / "consul"
SERVER = "consul-server"


def unavailable_reason() -> str | None:
    """Why real Consul cannot run here (one line), or None when :data:`CONSUL` is there."""
    return fetched_binary_missing("real Consul", "fetch-consul.sh", CONSUL)


#: Where a node's agent runs: (its address, the command prefix that runs a program there).
Placement = Callable[[str], "tuple[str, list[str]]"]


def _loopback(node: str) -> tuple[str, list[str]]:
    return "127.0.0.1", []


class _Agent:
    """One ``consul agent`` process: its configuration file, data folder, port and log."""

    def __init__(self, name: str, workdir: Path, config: dict, prefix: list[str]) -> None:
        self.name = name
        self.prefix = prefix
        self.dir = workdir / f"agent-{len(list(workdir.iterdir()))}"
        self.dir.mkdir()
        self.config_file = self.dir / "config.json"
        self.config_file.write_text(json.dumps({**config, "node_name": name, "data_dir": str(self.dir / "data")}))
        self.proc: subprocess.Popen | None = None

    def start(self, *extra: str) -> None:
        with open(self.dir / "agent.log", "ab") as log:
            self.proc = subprocess.Popen([*self.prefix, str(CONSUL), "agent", *extra,
                                          "-config-file", str(self.config_file)],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self) -> str:
        return (self.dir / "agent.log").read_text(errors="replace")[-2000:]


class ConsulCluster:
    """Real Consul agents on loopback for ``nodes``; see the module docstring.

    ``acl_token`` turns ACLs on with default deny and that token as the master
    (management) token; ``restricted_token`` (a UUID, as Consul wants a secret
    ID) is then made a token whose one policy reads the nodes and services
    named by the prefixes, like the dev agent's; ``tls_cert``/``tls_key`` serve
    HTTPS instead of HTTP.
    ``server_address`` is where the server agent binds, ``placement`` where each
    node's agent runs (default: all on loopback; the multi-host bed puts each in
    its host's network namespace, at the host's address).
    """

    kind = "consul"

    def __init__(self, nodes: list[str] | tuple[str, ...] = ("gpu-a",), acl_token: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None, datacenter: str = "dc1",
                 server_address: str = "127.0.0.1", placement: Placement = _loopback,
                 restricted_token: str | None = None, restricted_node_prefixes: list[str] | tuple[str, ...] = (),
                 restricted_service_prefixes: list[str] | tuple[str, ...] = ()) -> None:
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        if restricted_token is not None and acl_token is None:
            raise ValueError("restricted_token needs acl_token (ACLs on)")
        if not nodes or len(set(nodes)) != len(nodes) or SERVER in nodes:
            raise ValueError(f"nodes must be distinct names other than {SERVER!r}, got {list(nodes)}")
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key must be given together")
        self.nodes = list(nodes)
        self.acl_token = acl_token
        self.tls = tls_cert is not None
        self.datacenter = datacenter
        self._tls_files = (tls_cert, tls_key)
        self._placement = placement
        self._addresses = {SERVER: server_address}
        self._server_serf = 0
        self._workdir: Path | None = None
        self._agents: dict[str, _Agent] = {}
        self._ports: dict[str, int] = {}
        self._restricted = (restricted_token, list(restricted_node_prefixes), list(restricted_service_prefixes))

    # -- lifecycle --------------------------------------------------------

    def start(self, timeout: float = 60.0) -> "ConsulCluster":
        if self._workdir is not None:
            raise RuntimeError("ConsulCluster already started")
        self._workdir = Path(tempfile.mkdtemp(prefix="hvd-elastic-consul-"))
        try:
            self._server_serf = ports.reserve()[0]
            for name in (SERVER, *self.nodes):
                self._launch(name)
            deadline = time.monotonic() + timeout
            for name in (SERVER, *self.nodes):
                self._wait_alive(name, deadline)
            if self._restricted[0] is not None:
                self._make_restricted_token(*self._restricted)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for agent in self._agents.values():
            agent.kill()
        self._agents.clear()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def __enter__(self) -> "ConsulCluster":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # -- nodes ------------------------------------------------------------

    def addr(self, node: str) -> str:
        """``host:port`` of ``node``'s agent HTTP(S) API."""
        self._known(node)
        return f"{self._addresses[node]}:{self._ports[node]}"

    def url(self, node: str) -> str:
        return f"{'https' if self.tls else 'http'}://{self.addr(node)}"

    def addresses(self) -> dict[str, str]:
        return {name: self.addr(name) for name in self.nodes}

    def is_running(self, node: str) -> bool:
        self._known(node)
        return self._agents[node].running()

    def stop_node(self, node: str, timeout: float = 60.0) -> None:
        """SIGKILL ``node``'s client agent; returns once the server marks its serfHealth critical."""
        self._known(node)
        self._agents[node].kill()
        deadline = time.monotonic() + timeout
        while self._serf_health(node) == "passing":
            if time.monotonic() > deadline:
                raise TimeoutError(f"Consul did not mark {node} critical within {timeout:.0f}s")
            time.sleep(0.2)

    def add_node(self, node: str, timeout: float = 60.0) -> None:
        """A new node whose agent joins the running cluster (placed by ``placement``)."""
        if node in self.nodes or node == SERVER:
            raise ValueError(f"node {node!r} exists already")
        self.nodes.append(node)
        self._launch(node)
        self._wait_alive(node, time.monotonic() + timeout)

    def start_node(self, node: str, timeout: float = 60.0) -> None:
        """Restart ``node``'s agent (same port, name, data); returns once it is alive again."""
        self._known(node)
        if self._agents[node].running():
            raise RuntimeError(f"{node}'s agent is running")
        self._agents[node].start()
        self._wait_alive(node, time.monotonic() + timeout)

    # -- helpers ----------------------------------------------------------

    def _launch(self, name: str) -> None:
        server = name == SERVER
        prefix: list[str] = []
        if not server:
            self._addresses[name], prefix = self._placement(name)
        self._ports[name] = ports.reserve()[0]
        agent = _Agent(name, self._workdir, self._config(name, server=server), prefix)
        self._agents[name] = agent
        agent.start(*(["-dev"] if server else []))

    def _config(self, name: str, *, server: bool) -> dict:
        address = self._addresses[name]
        listen = {"dns": -1, "grpc": -1, "serf_lan": self._server_serf if server else ports.reserve()[0],
                  "http": -1, "https": -1}
        if server:  # a client agent dials the server port it learns by gossip (setting it to -1 crashes 1.8.7)
            listen["serf_wan"], listen["server"] = ports.reserve(2)
        listen["https" if self.tls else "http"] = self._ports[name]
        config: dict = {"datacenter": self.datacenter, "primary_datacenter": self.datacenter,
                        "bind_addr": address, "advertise_addr": address, "client_addr": address,
                        "ports": listen, "log_level": "warn", "disable_update_check": True,
                        "leave_on_terminate": False}  # a stopped node is a dead agent, not a graceful leave
        if not server:
            config["retry_join"] = [f"{self._addresses[SERVER]}:{self._server_serf}"]
            config["retry_interval"] = "1s"
        if self.acl_token is not None:
            config["acl"] = {"enabled": True, "default_policy": "deny", "enable_token_persistence": False,
                             "tokens": {"master": self.acl_token, "agent": self.acl_token}
                             if server else {"agent": self.acl_token}}
        if self.tls:
            config["cert_file"], config["key_file"] = self._tls_files
        return config

    def _make_restricted_token(self, secret: str, nodes: list[str], services: list[str]) -> None:
        rules = "".join(f'{kind}_prefix "{prefix}" {{ policy = "read" }}\n'
                        for kind, prefixes in (("node", nodes), ("service", services)) for prefix in prefixes)
        server = self._client_config(SERVER)
        client.request(server, "/v1/acl/policy", method="PUT", body={"Name": "restricted-reader", "Rules": rules},
                       timeout=10.0)
        client.request(server, "/v1/acl/token", method="PUT", timeout=10.0,
                       body={"SecretID": secret, "Policies": [{"Name": "restricted-reader"}]})

    def _client_config(self, node: str) -> ConsulConfig:
        return ConsulConfig(host=self._addresses[node], port=self._ports[node], scheme="https" if self.tls else "http",
                            verify=False, token=self.acl_token)

    def _serf_health(self, node: str) -> str | None:
        """The server's verdict on ``node``'s agent (``serfHealth`` status), None when unknown."""
        try:
            checks = client.get_json(self._client_config(SERVER), f"/v1/health/node/{node}", timeout=5.0,
                                     retry=False)
        except ConsulError:
            return None
        return next((c["Status"] for c in checks if c.get("CheckID") == "serfHealth"), None)

    def _wait_alive(self, node: str, deadline: float) -> None:
        last: object = None
        while time.monotonic() < deadline:
            agent = self._agents[node]
            if not agent.running():
                raise RuntimeError(f"consul agent {node} exited ({agent.proc.returncode}):\n{agent.log_tail()}")
            try:
                if api.leader(self._client_config(node), timeout=5.0) and self._serf_health(node) == "passing":
                    return
            except ConsulError as exc:
                last = exc
            time.sleep(0.1)
        raise TimeoutError(f"consul agent {node} not alive in the cluster: {last}\n{self._agents[node].log_tail()}")

    def _known(self, node: str) -> None:
        if node not in self.nodes:
            raise KeyError(f"unknown node {node!r} (known: {', '.join(self.nodes)})")


#: The Consuls a suite runs against: the project's dev agent, and HashiCorp's.
KINDS = ("dev", "consul")


def consul_cluster(kind: str, nodes: list[str] | tuple[str, ...], **options):
    """A not yet started cluster of ``kind`` (one of :data:`KINDS`) for ``nodes``.

    ``options`` common to both: ``acl_token``, ``tls_cert``, ``tls_key``, ``datacenter``, ``restricted_token``
    (a UUID), ``restricted_node_prefixes``, ``restricted_service_prefixes``.
    """
    if kind == "dev":
        from hvd_elastic.devagent import DevCluster

        return DevCluster(nodes=list(nodes), **options)
    if kind == "consul":
        return ConsulCluster(nodes, **options)
    raise ValueError(f"unknown Consul kind {kind!r}, expected one of {', '.join(KINDS)}")
