"""HashiCorp Consul on this machine: :class:`ConsulCluster` has :class:`~hvd_elastic.devagent.DevCluster`'s interface.

So the demo runs on either (``hvd-elastic demo --consul``), and one test fixture
runs a suite against both (:func:`consul_cluster`).  The binary is
``consul`` next to the venv's Python, put there by ``scripts/fetch-consul.sh``
(from ``scripts/bootstrap.sh``): Consul 1.8.7, the oldest the project supports.

The layout is production's, on loopback: one server agent (node
``consul-server``, ``-dev``: in memory, its own leader at once) and, for every
node, a client agent joined to it by gossip, with its own HTTP port, node name
and data folder; each node's address is its client agent's, as a GPU node's
node agent talks to its local agent.  ``servers=3`` (any odd number) makes the
servers a Raft quorum instead: nodes ``consul-server-1..3``, not ``-dev`` but
``server``/``bootstrap_expect`` with their state on disk, all on the server
address with ports of their own, joined to each other and every client agent
to all of them; Consul's default Raft timing (no ``raft_multiplier``), so the
loss of the leader is a real election that takes seconds.
Contracts that differ from the dev agent only in time, not in what is seen:

* :meth:`start` returns once every agent answers, a leader is elected and the
  servers' catalog has every node with ``serfHealth`` passing;
* :meth:`stop_node` SIGKILLs a node's agent (its port closes at once) and
  returns once the server marks the node's ``serfHealth`` critical: gossip's
  failure detection takes a moment where the dev agent flips at once;
* :meth:`start_node` restarts it with the same port, name and data folder (its
  registered services come back from disk, as Consul persists them) and returns
  once it is alive again.

With a quorum, :meth:`leader` names the server that leads, :meth:`stop_server`
SIGKILLs one (the leader, say: the survivors elect another, :meth:`wait_leader`)
and :meth:`start_server` brings it back with its data, as a rebooted server.
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
SERVER = "consul-server"  # the one server's node name; a quorum's are consul-server-1..n


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
    ``server_address`` is where the server agents bind, ``placement`` where each
    node's agent runs (default: all on loopback; the multi-host bed puts each in
    its host's network namespace, at the host's address).  ``servers``: how many
    server agents, an odd number (1: the ``-dev`` server; more: a Raft quorum).
    """

    kind = "consul"

    def __init__(self, nodes: list[str] | tuple[str, ...] = ("gpu-a",), acl_token: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None, datacenter: str = "dc1",
                 server_address: str = "127.0.0.1", placement: Placement = _loopback,
                 restricted_token: str | None = None, restricted_node_prefixes: list[str] | tuple[str, ...] = (),
                 restricted_service_prefixes: list[str] | tuple[str, ...] = (), servers: int = 1) -> None:
        # An even number adds a server without adding a failure it survives (4 tolerate one, as 3 do).
        if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1 or servers % 2 == 0:
            raise ValueError(f"servers must be an odd number >= 1 (1, 3, 5...), got {servers!r}")
        #: The server agents' node names (a quorum's servers are not :attr:`nodes`).
        self.server_nodes = [SERVER] if servers == 1 else [f"{SERVER}-{i}" for i in range(1, servers + 1)]
        if restricted_token is not None and acl_token is None:
            raise ValueError("restricted_token needs acl_token (ACLs on)")
        if not nodes or len(set(nodes)) != len(nodes) or set(nodes) & set(self.server_nodes):
            raise ValueError(f"nodes must be distinct names other than {', '.join(map(repr, self.server_nodes))}, "
                             f"got {list(nodes)}")
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key must be given together")
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        self.nodes = list(nodes)
        self.acl_token = acl_token
        self.tls = tls_cert is not None
        self.datacenter = datacenter
        self._tls_files = (tls_cert, tls_key)
        self._placement = placement
        self._addresses = dict.fromkeys(self.server_nodes, server_address)
        # Every server's serf_lan and server (RPC) port, chosen before any starts: they join each other by the
        # first, and /v1/status/leader names the leader by the second.
        self._serf: dict[str, int] = {}
        self._rpc: dict[str, int] = {}
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
            for name in self.server_nodes:
                self._serf[name], self._rpc[name] = ports.reserve(2)
            for name in (*self.server_nodes, *self.nodes):
                self._launch(name)
            deadline = time.monotonic() + timeout
            for name in (*self.server_nodes, *self.nodes):
                self._wait_alive(name, deadline)
            secret, node_prefixes, service_prefixes = self._restricted
            if secret is not None:
                self._make_restricted_token(secret, node_prefixes, service_prefixes)
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
        """``host:port`` of ``node``'s agent HTTP(S) API; ``node`` may also name a server agent."""
        if node not in self.server_nodes:
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
        if node in self.nodes or node in self.server_nodes:
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

    # -- servers ----------------------------------------------------------

    def leader(self) -> str | None:
        """The server node that leads, as every running server sees it (``/v1/status/leader``).

        None while they do not agree on one that runs: no leader yet, an
        election under way, or a follower still naming a leader that died
        (it does until its heartbeat times out).
        """
        by_rpc = {f"{self._addresses[name]}:{self._rpc[name]}": name for name in self.server_nodes}
        seen = set()
        for name in self._running_servers():
            try:
                seen.add(by_rpc.get(api.leader(self._client_config(name), timeout=5.0)))
            except ConsulError:
                return None
        leader = seen.pop() if len(seen) == 1 else None
        return leader if leader is not None and self._agents[leader].running() else None

    def wait_leader(self, timeout: float = 60.0) -> str:
        """The leader's node name, once the running servers agree on one (:meth:`leader`)."""
        deadline = time.monotonic() + timeout
        while (name := self.leader()) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no Consul leader within {timeout:.0f}s (running servers: "
                                   f"{', '.join(self._running_servers()) or 'none'})")
            time.sleep(0.1)
        return name

    def stop_server(self, name: str) -> None:
        """SIGKILL server ``name``'s agent; returns at once (the leader's loss is noticed by a Raft timeout)."""
        self._known_quorum_server(name)
        self._agents[name].kill()

    def start_server(self, name: str, timeout: float = 120.0) -> None:
        """Restart server ``name`` (same ports, node name and data folder, so the same Raft identity); returns
        once it is alive, a leader exists and it is a voter again.

        A voter, not merely a member: Consul's autopilot may have pruned the dead
        server from the peer set and re-adds it as a non-voter, promoted once it
        has been healthy for a while (10 s); until then the quorum would not
        survive another loss.
        """
        self._known_quorum_server(name)
        if self._agents[name].running():
            raise RuntimeError(f"{name}'s agent is running")
        self._agents[name].start()
        deadline = time.monotonic() + timeout
        self._wait_alive(name, deadline)
        while name not in self.voters():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not a Raft voter again within {timeout:.0f}s: {self.voters()}")
            time.sleep(0.2)

    # -- helpers ----------------------------------------------------------

    def _launch(self, name: str) -> None:
        if self._workdir is None:
            raise RuntimeError("ConsulCluster not started: call start() first")
        server = name in self.server_nodes
        prefix: list[str] = []
        if not server:
            self._addresses[name], prefix = self._placement(name)
        self._ports[name] = ports.reserve()[0]
        agent = _Agent(name, self._workdir, self._config(name, server=server), prefix)
        self._agents[name] = agent
        agent.start(*(["-dev"] if server and len(self.server_nodes) == 1 else []))

    def _config(self, name: str, *, server: bool) -> dict:
        address = self._addresses[name]
        listen = {"dns": -1, "grpc": -1, "serf_lan": self._serf[name] if server else ports.reserve()[0],
                  "http": -1, "https": -1}
        if server:  # a client agent dials the server port it learns by gossip (setting it to -1 crashes 1.8.7)
            listen["serf_wan"], listen["server"] = ports.reserve()[0], self._rpc[name]
        listen["https" if self.tls else "http"] = self._ports[name]
        config: dict = {"datacenter": self.datacenter, "primary_datacenter": self.datacenter,
                        "bind_addr": address, "advertise_addr": address, "client_addr": address,
                        "ports": listen, "log_level": "warn", "disable_update_check": True,
                        "leave_on_terminate": False}  # a stopped node is a dead agent, not a graceful leave
        # A client agent joins every server, a quorum's server the others: any one of them may be down.
        joins = [f"{self._addresses[s]}:{self._serf[s]}" for s in self.server_nodes if s != name]
        if server and joins:
            config.update(server=True, bootstrap_expect=len(self.server_nodes))
        if joins:
            config["retry_join"] = joins
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
        server = self._server_config()
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
            checks = client.get_json(self._server_config(), f"/v1/health/node/{node}", timeout=5.0, retry=False)
        except ConsulError:
            return None
        return next((c["Status"] for c in checks if c.get("CheckID") == "serfHealth"), None)

    def _running_servers(self) -> list[str]:
        return [name for name in self.server_nodes if self._agents[name].running()]

    def _server_config(self) -> ConsulConfig:
        """A running server's API: the catalog and Raft as the cluster sees them (read through its leader)."""
        running = self._running_servers()
        if not running:
            raise RuntimeError("no Consul server agent is running")
        return self._client_config(running[0])

    def voters(self) -> list[str]:
        """The Raft voters' node names (``/v1/operator/raft/configuration``); [] while the leader cannot say."""
        try:
            answer = client.get_json(self._server_config(), "/v1/operator/raft/configuration", timeout=5.0,
                                     retry=False)
        except ConsulError:
            return []
        return sorted(s["Node"] for s in answer.get("Servers", []) if s.get("Voter"))

    def _wait_alive(self, node: str, deadline: float) -> None:
        last: object = None
        while time.monotonic() < deadline:
            agent = self._agents[node]
            if not agent.running():
                code = None if agent.proc is None else agent.proc.returncode  # None: never started
                raise RuntimeError(f"consul agent {node} exited ({code}):\n{agent.log_tail()}")
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

    def _known_quorum_server(self, name: str) -> None:
        if len(self.server_nodes) == 1:  # -dev keeps the catalog in memory: a restart would be a new, empty one
            raise RuntimeError("stopping a server needs a quorum (servers=3): the one -dev server keeps no state")
        if name not in self.server_nodes:
            raise KeyError(f"unknown server {name!r} (known: {', '.join(self.server_nodes)})")


#: The Consuls a suite runs against: the project's dev agent, and HashiCorp's.
KINDS = ("dev", "consul")


def consul_cluster(kind: str, nodes: list[str] | tuple[str, ...], **options):
    """A not yet started cluster of ``kind`` (one of :data:`KINDS`) for ``nodes``.

    ``options`` common to both: ``acl_token``, ``tls_cert``, ``tls_key``, ``datacenter``, ``restricted_token``
    (a UUID), ``restricted_node_prefixes``, ``restricted_service_prefixes``; ``servers`` is real Consul's alone.
    """
    if kind == "dev":
        from hvd_elastic.devagent import DevCluster

        return DevCluster(nodes=list(nodes), **options)
    if kind == "consul":
        return ConsulCluster(nodes, **options)
    raise ValueError(f"unknown Consul kind {kind!r}, expected one of {', '.join(KINDS)}")
