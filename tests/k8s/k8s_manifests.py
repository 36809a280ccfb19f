"""Reading scripts/k8s as Kubernetes would: the manifests, their pods' containers, env and commands.

Nothing here talks to a cluster.  :func:`render_env` builds a container's environment the way the
kubelet does (``envFrom`` first, then ``env`` in order, ``$(VAR)`` expanded against what came
before, downward-API fields from values the caller gives), so the tests can run a manifest's exact
command with the environment it would have in a pod.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "scripts" / "k8s"
#: The Kubernetes version the manifests are validated against (native sidecars: GA in 1.33).
KUBERNETES_VERSION = "1.33.0"
#: Where the image puts the project (docs/howto/kubernetes.md, "The image").
IMAGE_BIN = "/opt/hvd-elastic/.venv/bin"


def manifest_files() -> list[Path]:
    return sorted(K8S.rglob("*.yaml"))


def load(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def resources() -> list[tuple[Path, dict]]:
    """Every Kubernetes object in scripts/k8s (kustomizations are not objects)."""
    return [(path, doc) for path in manifest_files() for doc in load(path) if doc.get("kind") != "Kustomization"]


def configmaps() -> dict[str, dict[str, str]]:
    return {doc["metadata"]["name"]: doc.get("data", {}) for _, doc in resources() if doc["kind"] == "ConfigMap"}


@dataclass
class Pod:
    """One pod template: where it is (``file: kind/name[/replica]``), its metadata and spec."""

    where: str
    metadata: dict
    spec: dict

    def containers(self) -> list[dict]:
        return [*self.spec.get("initContainers", []), *self.spec["containers"]]

    def container(self, name: str) -> dict:
        return next(c for c in self.containers() if c["name"] == name)


def pods() -> list[Pod]:
    found = []
    for path, doc in resources():
        where = f"{path.relative_to(K8S)}: {doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] in ("StatefulSet", "Job"):
            template = doc["spec"]["template"]
            found.append(Pod(where, template.get("metadata", {}), template["spec"]))
        elif doc["kind"] == "MPIJob":
            for replica, spec in doc["spec"]["mpiReplicaSpecs"].items():
                template = spec["template"]
                found.append(Pod(f"{where}/{replica}", template.get("metadata", {}), template["spec"]))
    return found


_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined names replaced, ``$$`` -> ``$``, unknown ones kept."""
    def one(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))
    return _REF.sub(one, text)


_ANNOTATION = re.compile(r"metadata\.annotations\['([^']+)'\]\Z")


def field_value(path: str, pod: Pod, fields: Mapping[str, str]) -> str:
    if match := _ANNOTATION.match(path):
        return pod.metadata["annotations"][match.group(1)]
    return fields[path]


def render_env(pod: Pod, container: dict, fields: Mapping[str, str],
               configmap_overrides: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, str]:
    """The container's environment as the kubelet builds it.

    ``fields``: downward-API values (``metadata.name``, ``status.hostIP``...).  ConfigMaps come from
    the manifests, with ``configmap_overrides`` applied (a test's Consul port, say).  A Secret or a
    resourceFieldRef source raises: the manifests use neither for variables.
    """
    cms = configmaps()
    for name, data in (configmap_overrides or {}).items():
        cms[name] = {**cms[name], **data}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(cms[source["configMapRef"]["name"]])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
        elif "fieldRef" in var["valueFrom"]:
            env[var["name"]] = field_value(var["valueFrom"]["fieldRef"]["fieldPath"], pod, fields)
        elif "configMapKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["configMapKeyRef"]
            env[var["name"]] = cms[ref["name"]][ref["key"]]
        else:
            raise AssertionError(f"{pod.where}: {container['name']}: {var['name']} comes from {var['valueFrom']}")
    return env


@dataclass
class Command:
    """An argument list a container runs: its main command, a lifecycle hook or a line of a ``sh -c``."""

    where: str
    container: dict
    argv: list[str]
    hook: bool  # a lifecycle exec hook: Kubernetes expands nothing in it


_SHELL_OPS = {"&&", "||", ";", "|", "&"}


def shell_commands(script: str, env: Mapping[str, str]) -> list[list[str]]:
    """The simple commands of a POSIX shell script, ``"$VAR"`` taken from ``env``.

    Commands end at a newline (a backslash continues the line), ``;``, ``&``, ``&&``, ``|`` or ``||``;
    ``#`` comments are dropped.  No other shell syntax is understood: ``while``, ``do``, ``trap`` and the
    like come out as commands of their own, which no test takes for ``hvd-elastic``.
    """
    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        current: list[str] = []
        for token in lexer:
            if token in _SHELL_OPS:
                commands.append(current)
                current = []
            else:
                current.append(re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m.group(1), ""), token))
        commands.append(current)
    return [c for c in commands if c]


def mounted_configmap_file(pod: Pod, container: dict, path: str) -> str | None:
    """The text of ``path`` in ``container`` when a ConfigMap volume of the pod provides that file, else None."""
    volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        source = volumes.get(mount["name"], {}).get("configMap")
        if source is None:
            continue
        if "subPath" in mount:
            relative = mount["subPath"] if path == mount["mountPath"] else None
        elif os.path.dirname(path) == mount["mountPath"].rstrip("/"):
            relative = os.path.basename(path)
        else:
            relative = None
        keys = {item["path"]: item["key"] for item in source.get("items", [])} or None
        key = relative if keys is None else keys.get(relative)
        data = configmaps().get(source["name"], {})
        if key in data:
            return data[key]
    return None


def commands(pod: Pod, container: dict, env: Mapping[str, str]) -> Iterator[Command]:
    """Every argument list ``container`` runs, expanded as Kubernetes (and ``sh -c``) would."""
    where = f"{pod.where}: {container['name']}"
    main = [expand(arg, env) for arg in [*container.get("command", []), *container.get("args", [])]]
    if main[:2] == ["/bin/sh", "-c"] and len(main) == 3:
        for argv in shell_commands(main[2], env):
            yield Command(f"{where} (sh -c)", container, argv, hook=False)
    elif main[:1] == ["/bin/sh"] and len(main) == 2 and (script := mounted_configmap_file(pod, container, main[1])):
        # The worker's entrypoint: a script the pod mounts from a ConfigMap.
        for argv in shell_commands(script, env):
            yield Command(f"{where} (entrypoint)", container, argv, hook=False)
    elif program(main[:1] or [""]) == "hvd-elastic" and main[1:2] == ["launch"] and "--" in main:
        # hvd-elastic launch [its options] -- COMMAND: two argument lists, each for its own parser.
        split = main.index("--")
        yield Command(f"{where} (launch)", container, main[:split], hook=False)
        yield Command(where, container, main[split + 1:], hook=False)
    elif main:
        yield Command(where, container, main, hook=False)
    for phase, handler in container.get("lifecycle", {}).items():
        if "exec" in handler:
            yield Command(f"{where} {phase}", container, list(handler["exec"]["command"]), hook=True)


def program(argv: list[str]) -> str:
    return Path(argv[0]).name
