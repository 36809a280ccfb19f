"""The commands and environment in scripts/k8s are ones our CLIs and horovodrun accept, wired as intended.

Each container's environment is built as the kubelet builds it (:func:`k8s_manifests.render_env`,
downward-API fields from :data:`FIELDS`), every ``hvd-elastic`` argument list in a container's
command, a ``sh -c`` line or a lifecycle hook is parsed by ``hvd_elastic.cli``'s own parser under
that environment (its ``HVD_ELASTIC_*`` defaults go through the same argument types), and run with
``--help`` appended; horovodrun's arguments go through Horovod's own ``parse_args`` and must be
options ``horovodrun --help`` lists.  Rules the API server or kubelet enforce that no JSON schema
states are checked here too.
"""

from __future__ import annotations

import argparse
import configparser
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_elastic import cli
from hvd_elastic.options import consul_config
from k8s_manifests import IMAGE_BIN, REPO, Command, Pod, commands, configmaps, pods, program, render_env, resources

HVD_ELASTIC = Path(sys.executable).parent / "hvd-elastic"
HOROVODRUN = Path(sys.executable).parent / "horovodrun"
FIELDS = {"metadata.name": "hvd-worker-3", "metadata.namespace": "team-a", "status.hostIP": "10.0.7.21",
          "status.podIP": "10.244.3.17", "spec.nodeName": "gpu-node-7"}
ALL = [(pod, c, cmd) for pod in pods() for c in pod.containers()
       for cmd in commands(pod, c, render_env(pod, c, FIELDS))]
#: resourceFieldRef resources the API server accepts (k8s.io/kubernetes pkg/apis/core/validation:
#: validContainerResourceFieldPathExpressions, plus the hugepages- prefixes); nvidia.com/gpu is not one.
DOWNWARD_RESOURCES = {"limits.cpu", "limits.memory", "limits.ephemeral-storage", "requests.cpu", "requests.memory",
                      "requests.ephemeral-storage"}
#: The page that says how to go from an empty cluster to a job (README.md links to it).
KUBERNETES_GUIDE = REPO / "docs" / "howto" / "kubernetes.md"
#: Objects the user creates (docs/howto/kubernetes.md), or the operator does (the MPIJob's ssh Secret).
CREATED_BY_USER = {("Secret", "hvd-elastic-consul-token"), ("Secret", "hvd-elastic-ssh"),
                   ("ConfigMap", "hvd-elastic-consul-ca")}


def hvd_commands() -> list[tuple[Pod, dict, Command]]:
    return [item for item in ALL if program(item[2].argv) == "hvd-elastic"]


def ids(items) -> list[str]:
    return [f"{cmd.where}: {' '.join(cmd.argv[1:3])}" for _, _, cmd in items]


def dry_parse(argv: list[str], env: dict[str, str], monkeypatch) -> argparse.Namespace:
    """``hvd_elastic.cli``'s parser on ``argv[1:]`` with exactly ``env`` as the environment (defaults read it)."""
    for name in list(os.environ):
        if name.startswith(("CONSUL_", "HVD_ELASTIC_")):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    sub = cli._subcommand(argv[1:])
    try:
        return cli.build_parser(only=sub).parse_args(argv[1:])
    except SystemExit as exc:
        pytest.fail(f"hvd-elastic refused {argv[1:]} (exit {exc.code})")


def test_the_manifests_run_hvd_elastic_in_every_role():
    roles = {(cmd.argv[1], cmd.hook) for _, _, cmd in hvd_commands()}
    assert roles == {("node-agent", False), ("drain", True), ("undrain", False), ("launch", False),
                     ("standby", False)}, roles
    assert all(cmd.argv[0] == f"{IMAGE_BIN}/hvd-elastic" for _, _, cmd in hvd_commands())


@pytest.mark.parametrize("pod, container, cmd", hvd_commands(), ids=ids(hvd_commands()))
def test_hvd_elastic_commands_parse_with_the_pods_environment(pod, container, cmd, monkeypatch, tmp_path):
    assert not cmd.hook or "$(" not in " ".join(cmd.argv), f"{cmd.where}: Kubernetes does not expand $(VAR) in hooks"
    env = render_env(pod, container, FIELDS)
    assert env["CONSUL_HTTP_TOKEN_FILE"] == "/etc/hvd-elastic/consul-token/token" and "CONSUL_HTTP_TOKEN" not in env
    token = tmp_path / "token"  # the Secret's file, as mounted (mode 0400)
    token.write_text("s3cret-token\n")
    token.chmod(0o400)
    args = dry_parse(cmd.argv, {**env, "CONSUL_HTTP_TOKEN_FILE": str(token)}, monkeypatch)
    if args.command == "launch":  # relaunches the horovodrun that follows it (checked as horovodrun's below)
        assert args.max_restarts >= 1 and args.argv == []
        return
    standby = configmaps()["hvd-elastic-standby"]
    if args.command == "standby":  # the worker container's entrypoint (more in the standby tests below)
        assert args.name == standby["HVD_ELASTIC_STANDBY"] and args.preload
        assert ",".join(args.preload) == standby["HVD_ELASTIC_STANDBY_PRELOAD"]
        return
    config = consul_config(args)
    # The Consul client agent of the pod's own node (the Helm chart's DaemonSet), with the token from its file.
    assert config.base_url == "http://10.0.7.21:8500" and config.token == "s3cret-token"
    assert args.token is None and args.service == "horovod"
    # One instance per pod: a drain or undrain never touches the other pods on the node's agent.
    assert args.service_id == "hvd-worker-3"
    if args.command == "drain":
        assert args.wait == 270 and args.reason
        grace = pod.spec["terminationGracePeriodSeconds"]
        assert grace >= args.wait + 20, f"{pod.where}: grace {grace}s leaves the worker and the sidecar no time to stop"
    if args.command == "node-agent":
        assert args.slots == int(pod.metadata["annotations"]["hvd-elastic/slots"])
        assert args.probes is None and env["HVD_ELASTIC_PROBES"] == "memory,disk"
        assert args.checkpoint_path == "/checkpoints" and args.leave_timeout == 0
        # Withheld from discovery until the worker container's standby answers, at most the ConfigMap's wait.
        assert args.standby == standby["HVD_ELASTIC_STANDBY"] and "--standby" in cmd.argv
        assert args.standby_wait == float(standby["HVD_ELASTIC_STANDBY_WAIT"]) > 0
        expected = "10.244.3.17" if "MPIJob" in pod.where else "hvd-worker-3.hvd-worker.team-a.svc"
        assert args.address == expected


@pytest.mark.parametrize("pod, container, cmd", hvd_commands(), ids=ids(hvd_commands()))
def test_hvd_elastic_commands_with_help_appended_exit_0(pod, container, cmd):
    result = subprocess.run([str(HVD_ELASTIC), *cmd.argv[1:], "--help"], capture_output=True, text=True, timeout=60,
                            env={k: v for k, v in os.environ.items() if not k.startswith(("CONSUL_", "HVD_ELASTIC_"))})
    assert result.returncode == 0, result.stderr
    assert f"usage: hvd-elastic {cmd.argv[1]}" in result.stdout


def launchers() -> list[tuple[Pod, dict, Command]]:
    return [item for item in ALL if program(item[2].argv) == "horovodrun"]


@pytest.fixture(scope="module")
def horovodrun_help() -> str:
    return subprocess.run([str(HOROVODRUN), "--help"], capture_output=True, text=True, timeout=120, check=True).stdout


@pytest.mark.parametrize("pod, container, cmd", launchers(), ids=ids(launchers()))
def test_horovodrun_arguments_are_horovods(pod, container, cmd, horovodrun_help, monkeypatch):
    from horovod.runner import launch

    argv = cmd.argv
    assert argv[0] == f"{IMAGE_BIN}/horovodrun"
    monkeypatch.setattr(sys, "argv", ["horovodrun", *argv[1:]])
    try:
        args = launch.parse_args()
    except SystemExit as exc:
        pytest.fail(f"horovodrun refused {argv[1:]} (exit {exc.code})")
    assert args.command and argv[-len(args.command):] == args.command
    flags = [arg for arg in argv[:-len(args.command)] if arg.startswith("-")]
    for flag in flags:
        assert re.search(rf"(^|[\s,\[]){re.escape(flag)}[\s,=\]]", horovodrun_help,
                         re.M), f"horovodrun --help has no {flag}"
    assert (args.num_proc, args.min_num_proc, args.max_num_proc) == (2, 1, 16)
    assert args.host_discovery_script == f"{IMAGE_BIN}/consul_hosts"
    name = configmaps()["hvd-elastic-standby"]["HVD_ELASTIC_STANDBY"]
    assert args.command == [f"{IMAGE_BIN}/hvd-elastic", "exec", "--standby", name, "--", f"{IMAGE_BIN}/python",
                            "examples/train_elastic.py", "--workdir", "/checkpoints/run1"]
    assert (REPO / "examples" / "train_elastic.py").exists() and container["workingDir"] == "/opt/hvd-elastic"
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    assert "discovery/consul_hosts" in setup["options"]["scripts"].split()  # installed next to horovodrun


@pytest.mark.parametrize("pod, container, cmd", launchers(), ids=ids(launchers()))
def test_discovery_under_the_launchers_environment(pod, container, cmd, monkeypatch, tmp_path):
    env = render_env(pod, container, FIELDS)
    (tmp_path / "token").write_text("")  # ACLs off: an empty token file
    args = dry_parse([f"{IMAGE_BIN}/hvd-elastic", "discover"],
                     {**env, "CONSUL_HTTP_TOKEN_FILE": str(tmp_path / "token")}, monkeypatch)
    assert args.host_name == "service-address"  # pods' addresses, not the Kubernetes node names
    assert consul_config(args).base_url == "http://10.0.7.21:8500"
    # horovodrun copies its whole environment onto the workers' ssh command lines: no secret in it.
    assert "CONSUL_HTTP_TOKEN" not in env and not any(re.search(r"TOKEN$|SECRET|PASSWORD", k) for k in env
                                                      if k != "CONSUL_HTTP_TOKEN_FILE")


def test_no_secret_reaches_any_environment_and_the_token_is_a_private_file():
    for pod in pods():
        volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
        for container in pod.containers():
            for var in container.get("env", []):
                assert "secretKeyRef" not in var.get("valueFrom", {}), f"{pod.where}: {var['name']} from a Secret"
                assert var["name"] != "CONSUL_HTTP_TOKEN"
            env = render_env(pod, container, FIELDS)
            if "CONSUL_HTTP_TOKEN_FILE" not in env:
                continue
            mount = next(m for m in container["volumeMounts"]
                         if m["mountPath"] == os.path.dirname(env["CONSUL_HTTP_TOKEN_FILE"]))
            secret = volumes[mount["name"]]["secret"]
            assert secret["secretName"] == "hvd-elastic-consul-token" and secret["defaultMode"] == 0o400


def test_downward_api_resources_are_ones_the_api_server_accepts():
    for pod in pods():
        for container in pod.containers():
            for var in container.get("env", []):
                ref = var.get("valueFrom", {}).get("resourceFieldRef")
                assert ref is None or ref["resource"] in DOWNWARD_RESOURCES or ref["resource"].split(".")[1].startswith(
                    "hugepages-"), f"{pod.where}: {container['name']}: {var['name']} from {ref}"


def test_slots_equal_the_gpu_limit_everywhere():
    for path, doc in resources():
        if doc["kind"] == "MPIJob":
            worker = doc["spec"]["mpiReplicaSpecs"]["Worker"]["template"]
            assert doc["spec"]["slotsPerWorker"] == int(worker["metadata"]["annotations"]["hvd-elastic/slots"])
    workers = [pod for pod in pods() if any(c["name"] == "node-agent" for c in pod.containers())]
    assert len(workers) == 2
    for pod in workers:
        gpus = pod.container("worker")["resources"]["limits"]["nvidia.com/gpu"]
        assert str(gpus) == pod.metadata["annotations"]["hvd-elastic/slots"], pod.where
        assert render_env(pod, pod.container("node-agent"), FIELDS)["HVD_ELASTIC_SLOTS"] == str(gpus)
        # The node agent is a native sidecar (stopped after the worker container) behind the stale-drain lift.
        names = [(c["name"], c.get("restartPolicy")) for c in pod.spec["initContainers"]]
        assert names == [("lift-stale-drain", None), ("node-agent", "Always")], names
        assert pod.spec["containers"][0]["name"] == "worker"  # the MPI operator mounts ssh keys in the first
        assert "preStop" in pod.container("worker")["lifecycle"]


def test_every_reference_resolves():
    defined = {(doc["kind"], doc["metadata"]["name"]) for _, doc in resources()}
    readme = KUBERNETES_GUIDE.read_text()
    for name in sorted(n for _, n in CREATED_BY_USER):
        assert name in readme, f"{KUBERNETES_GUIDE.relative_to(REPO)} does not say how to create {name}"
    for pod in pods():
        volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
        for container in pod.containers():
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, f"{pod.where}: {container['name']} mounts unknown {mount['name']}"
            for source in container.get("envFrom", []):
                assert ("ConfigMap", source["configMapRef"]["name"]) in defined
            assert container["image"] == "registry.example.com/hvd-elastic:0.1.0"
        for volume in volumes.values():
            if "secret" in volume:
                ref = ("Secret", volume["secret"]["secretName"])
            elif "configMap" in volume:
                ref = ("ConfigMap", volume["configMap"]["name"])
            elif "persistentVolumeClaim" in volume:
                ref = ("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
            else:
                continue
            assert ref in defined or ref in CREATED_BY_USER, f"{pod.where}: {ref} is neither shipped nor documented"
            if "persistentVolumeClaim" in volume:
                mounts = {m["mountPath"] for c in pod.containers() for m in c.get("volumeMounts", [])
                          if m["name"] == volume_name(volumes, volume)}
                assert mounts == {"/checkpoints"}, (pod.where, mounts)
    (pvc,) = [doc for _, doc in resources() if doc["kind"] == "PersistentVolumeClaim"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    (sts,) = [doc for _, doc in resources() if doc["kind"] == "StatefulSet"]
    (svc,) = [doc for _, doc in resources() if doc["kind"] == "Service"]
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"] and svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    (hpa,) = [doc for _, doc in resources() if doc["kind"] == "HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                             "name": sts["metadata"]["name"]}


def volume_name(volumes: dict, volume: dict) -> str:
    return next(name for name, v in volumes.items() if v is volume)


def test_readmes_secret_commands_make_what_the_pods_mount():
    """``kubectl create secret ... --from-file=KEY=...`` in the Kubernetes guide gives the keys the manifests read."""
    readme = KUBERNETES_GUIDE.read_text()
    made: dict[str, set[str]] = {}
    for match in re.finditer(r"kubectl create (?:secret generic|configmap) (\S+)"
                             r"((?:\s+\\?\s*--from-file=[^\s=]+=\S+)+)",
                             readme):
        made[match.group(1)] = set(re.findall(r"--from-file=([^\s=]+)=", match.group(2)))
    assert made == {"hvd-elastic-consul-token": {"token"}, "hvd-elastic-consul-ca": {"ca.crt"},
                    "hvd-elastic-ssh": {"id_ed25519", "id_ed25519.pub", "authorized_keys"}}, made
    env = render_env(LAUNCHER_POD, LAUNCHER_POD.containers()[0], FIELDS)
    assert os.path.basename(env["CONSUL_HTTP_TOKEN_FILE"]) == "token"
    assert os.path.basename(env["CONSUL_CACERT"]) == "ca.crt"


LAUNCHER_POD = next(pod for pod in pods() if pod.where.startswith("statefulset/launcher-job.yaml"))


# ------------------------------------------------------------------------------------------------- warm standbys

STANDBY = configmaps()["hvd-elastic-standby"]
#: A user switch between the entrypoint and the standby would fork workers as another user than ssh's.
USER_SWITCHES = {"su", "sudo", "runuser", "setpriv", "gosu", "su-exec", "chpst", "setuidgid", "capsh", "chroot",
                 "nsenter", "unshare"}


def worker_pods() -> list[Pod]:
    return [pod for pod in pods() if any(c["name"] == "node-agent" for c in pod.containers())]


def shape_of(pod: Pod) -> str:
    return pod.where.split("/", 1)[0]  # statefulset or mpijob


def entrypoint_commands(pod: Pod) -> list[tuple[dict, Command]]:
    """Every argument list the pod's containers run from a ConfigMap-mounted entrypoint script."""
    return [(c, cmd) for c in pod.containers() for cmd in commands(pod, c, render_env(pod, c, FIELDS))
            if cmd.where.endswith("(entrypoint)")]


def standby_container(pod: Pod) -> tuple[dict, Command]:
    found = [(c, cmd) for c, cmd in entrypoint_commands(pod)
             if program(cmd.argv) == "hvd-elastic" and cmd.argv[1:2] == ["standby"]]
    assert len(found) == 1, f"{pod.where}: {len(found)} standbys"
    return found[0]


def run_as_user(pod: Pod, container: dict) -> int | None:
    for context in (container.get("securityContext", {}), pod.spec.get("securityContext", {})):
        if "runAsUser" in context:
            return context["runAsUser"]
    return None


def mount_of(container: dict, path: str, pod: Pod) -> tuple[str, dict]:
    """(mount path, volume) of the volume that holds ``path`` in ``container`` (the deepest mount above it)."""
    volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
    above = [m for m in container.get("volumeMounts", [])
             if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert above, f"{pod.where}: {container['name']} has no volume holding {path}"
    mount = max(above, key=lambda m: len(m["mountPath"]))
    return mount["mountPath"], volumes[mount["name"]]


@pytest.mark.parametrize("launcher", launchers(), ids=ids(launchers()))
def test_the_worker_command_goes_through_the_standby_the_pods_run_and_gate_on(launcher, monkeypatch):
    """horovodrun's worker command is ``hvd-elastic exec --standby NAME -- PYTHON ...``, NAME being the standby that
    the worker pods of the same shape start and their node agents wait for, and it finds that standby's socket."""
    from horovod.runner import launch as horovod_launch
    from horovod.runner.common.util.env import is_exportable

    from hvd_elastic.commands import exec as launch
    from hvd_elastic.standby import protocol

    pod, container, cmd = launcher
    monkeypatch.setattr(sys, "argv", ["horovodrun", *cmd.argv[1:]])
    worker_command = horovod_launch.parse_args().command
    launcher_env = render_env(pod, container, FIELDS)
    # hvd-elastic's own parsers: the full CLI's (argparse) and the fast path the console script really takes.
    assert worker_command[0] == f"{IMAGE_BIN}/hvd-elastic" and worker_command[1] == "exec", worker_command
    args = dry_parse(worker_command, launcher_env, monkeypatch)  # exec's positional is its dest "command"
    name, command = launch.parse(worker_command[2:])
    assert worker_command[2:5] == ["--standby", name, "--"] and name == args.standby
    assert args.command == ["--", *command]
    assert command == [f"{IMAGE_BIN}/python", "examples/train_elastic.py", "--workdir", "/checkpoints/run1"]

    (workers,) = [p for p in worker_pods() if shape_of(p) == shape_of(pod)]
    agent = workers.container("node-agent")
    (agent_cmd,) = [c for c in commands(workers, agent, render_env(workers, agent, FIELDS))]
    worker, standby_cmd = standby_container(workers)
    standby_args = dry_parse(standby_cmd.argv, render_env(workers, worker, FIELDS), monkeypatch)
    agent_args = dry_parse(agent_cmd.argv, render_env(workers, agent, FIELDS), monkeypatch)
    assert name == standby_args.name == agent_args.standby == STANDBY["HVD_ELASTIC_STANDBY"], (
        name, standby_args.name, agent_args.standby)
    # The standby forks only for its own interpreter (sys.executable): the venv's python, in the same bin as the
    # hvd-elastic it is started as, which is the directory the launcher's equality check compares.
    assert standby_cmd.argv[0] == f"{IMAGE_BIN}/hvd-elastic" and os.path.dirname(command[0]) == IMAGE_BIN

    # The socket: the exec runs in an ssh session with none of the pod's variables, only what horovodrun copies
    # from the launcher's environment; the standby and the node agent read the pod's.
    directories = {render_env(workers, c, FIELDS).get(protocol.DIR_ENV) for c in (worker, agent)}
    assert directories == {launcher_env[protocol.DIR_ENV]} and is_exportable(protocol.DIR_ENV), directories
    monkeypatch.setenv(protocol.DIR_ENV, launcher_env[protocol.DIR_ENV])
    socket_dir = protocol.socket_path(name).parent  # raises if the path is over a Unix socket's 107 bytes
    shared = {mount_of(c, str(socket_dir), workers)[0] for c in (worker, agent)}
    assert len(shared) == 1, f"the worker container and the node agent see the socket under {shared}"
    (mount_path,) = shared
    for c in (worker, agent):
        volume = mount_of(c, str(socket_dir), workers)[1]
        assert "emptyDir" in volume and volume["name"] == "standby-socket", volume
    # A directory of the standby's own below the mount: an emptyDir is 0777, which the standby refuses.
    assert str(socket_dir.parent) == mount_path != str(socket_dir)


@pytest.mark.parametrize("pod", worker_pods(), ids=[p.where for p in worker_pods()])
def test_the_standby_runs_as_the_ssh_user_with_what_an_ssh_worker_has(pod):
    worker, standby_cmd = standby_container(pod)
    script = [cmd.argv for c, cmd in entrypoint_commands(pod) if c is worker]
    # In the container where sshd runs, so horovodrun's ssh sessions (and their direct workers) and the standby's
    # forked workers share one container: its GPUs, mounts, image and limits.
    assert any(program(argv) == "sshd" for argv in script), script
    assert worker is pod.spec["containers"][0] and worker["name"] == "worker"
    assert worker["ports"][0]["containerPort"] == 22
    assert worker["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert {m["mountPath"] for m in worker["volumeMounts"]} >= {"/checkpoints", "/dev/shm"}
    for other in pod.containers():  # nothing the forked workers need lives in another container
        if other is not worker:
            assert "nvidia.com/gpu" not in other.get("resources", {}).get("limits", {}), other["name"]
            assert "/dev/shm" not in {m["mountPath"] for m in other.get("volumeMounts", [])}, other["name"]
    # The ssh user is root (its keys in /root/.ssh, root logins by key) and so is the container, with no user
    # switch on the way to the standby; the node agent's gate asks as the same uid (SO_PEERCRED).
    if "MPIJob" in pod.where:
        (mpijob,) = [doc for _, doc in resources() if doc["kind"] == "MPIJob"]
        assert mpijob["spec"]["sshAuthMountPath"] == "/root/.ssh"
    else:
        assert "/root/.ssh" in {m["mountPath"] for m in worker["volumeMounts"]}
    (sshd,) = [argv for argv in script if program(argv) == "sshd"]
    assert "PermitRootLogin=prohibit-password" in sshd and "-D" in sshd  # foreground: the entrypoint waits on it
    assert run_as_user(pod, worker) == 0 == run_as_user(pod, pod.container("node-agent"))
    assert not [argv for argv in script if program(argv) in USER_SWITCHES], script
    # The standby's environment is the container's: no horovodrun marker in it, or the preStop drain would count
    # the standby itself as a worker still running and always wait to its deadline.
    from hvd_elastic.nodeagent.leave import WORKER_MARKERS

    assert not set(WORKER_MARKERS) & render_env(pod, worker, FIELDS).keys()


def test_the_entrypoint_starts_the_standby_and_sshd_in_the_background_and_forwards_stop_signals():
    """The script as text: what the parsed argument lists cannot show (``&``, the trap)."""
    script = configmaps()["hvd-elastic-worker-entrypoint"]["worker-entrypoint.sh"]
    lines = [line.strip() for line in script.splitlines()]
    standby = [line for line in lines if line.startswith(f"{IMAGE_BIN}/hvd-elastic standby ")]
    sshd = [line for line in lines if line.startswith("/usr/sbin/sshd ")]
    assert len(standby) == len(sshd) == 1 and standby[0].endswith(" &") and sshd[0].endswith(" &"), (standby, sshd)
    assert not [line for line in lines if line.startswith("exec ")]  # PID 1 stays the shell with the trap
    (trap,) = [line for line in lines if line.startswith("trap ")]
    assert trap.endswith(" TERM INT") and lines.index(trap) < lines.index(standby[0])
    assert 'while kill -0 "$standby" 2>/dev/null; do wait "$standby"; done' in lines  # outlives the standby's workers
    for pod in worker_pods():
        worker, _ = standby_container(pod)
        assert worker["command"] == ["/bin/sh", "/etc/hvd-elastic/entrypoint/worker-entrypoint.sh"]


def test_the_default_preload_is_the_example_scripts_heavy_imports():
    import ast

    from hvd_elastic import _LAZY
    from hvd_elastic.commands.standby import _modules
    from hvd_elastic.standby.server import BASE_MODULES

    tree = ast.parse((REPO / "examples" / "train_elastic.py").read_text())
    optional = {id(node) for handler in ast.walk(tree) if isinstance(handler, ast.Try)
                for node in ast.walk(handler) if any(isinstance(h.type, ast.Name) and h.type.id == "ImportError"
                                                     for h in handler.handlers)}
    imported, lazy = set(), set()
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
            if node.module == "hvd_elastic":
                lazy |= {_LAZY[alias.name] for alias in node.names if alias.name in _LAZY}
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "hvd_elastic":
            lazy |= {_LAZY[node.attr]} if node.attr in _LAZY else set()
    heavy = {m for m in imported if m.split(".")[0] not in sys.stdlib_module_names and m != "__future__"}
    expected = (heavy | lazy) - set(BASE_MODULES) - {"hvd_elastic"}  # the package itself exports lazily: cheap
    assert "hvd_elastic.training.runner" in lazy and "torch.utils.data" in expected
    assert set(_modules(STANDBY["HVD_ELASTIC_STANDBY_PRELOAD"])) == expected


def test_no_probe_asks_the_standby():
    """The node agent's gate withholds a pod whose standby is not ready; no probe of Kubernetes' may add to it (a
    failing readiness or liveness probe would take the pod's sshd, and its running workers, with it)."""
    for pod in pods():
        for container in pod.containers():
            for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
                text = str(container.get(kind, ""))
                assert "standby" not in text and STANDBY["HVD_ELASTIC_STANDBY_DIR"] not in text, (
                    f"{pod.where}: {container['name']} {kind} asks the standby")
