"""Every manifest in scripts/k8s is a valid object of its API, and a broken one is caught.

Kubernetes' own objects are validated by kubernetes-validate against the schemas of Kubernetes
:data:`KUBERNETES_VERSION` in strict mode (an unknown field fails, as ``kubectl apply
--validate=strict`` would).  The MPIJob is validated by check-jsonschema against the CRD's
``openAPIV3Schema`` copied into tests/k8s/schemas/ (its source commit is in the file's
``$comment``), once as the CRD states it and once made strict the way the API server prunes (an
object's unknown fields rejected), and its pod templates against Kubernetes' PodTemplate schema.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from k8s_manifests import K8S, KUBERNETES_VERSION, load, manifest_files, resources

SCHEMAS = Path(__file__).parent / "schemas"
MPIJOB_SCHEMA = SCHEMAS / "mpijob-v2beta1.json"
CHECK_JSONSCHEMA = Path(sys.executable).parent / "check-jsonschema"
OBJECTS = [(path, doc) for path, doc in resources() if doc["kind"] != "MPIJob"]
MPIJOB = K8S / "mpijob" / "mpijob.yaml"


def validate(doc: dict) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("doc", [doc for _, doc in OBJECTS],
                         ids=[f"{p.relative_to(K8S)}:{d['kind']}" for p, d in OBJECTS])
def test_kubernetes_objects_validate_strictly(doc):
    validate(doc)


def test_every_kind_is_covered():
    kinds = {doc["kind"] for _, doc in resources()}
    assert {"StatefulSet", "Service", "Job", "ConfigMap", "PersistentVolumeClaim", "HorizontalPodAutoscaler",
            "MPIJob"} <= kinds, kinds


def mutations(doc: dict) -> list[tuple[str, dict]]:
    """Broken copies of ``doc``: a misspelt field, a wrong type and, where the kind has one, a missing required
    field."""
    misspelt, wrong_type, missing = copy.deepcopy(doc), copy.deepcopy(doc), copy.deepcopy(doc)
    misspelt["metadata"]["lables"] = {"a": "b"}
    broken = [("misspelt", misspelt), ("wrong type", wrong_type), ("missing", missing)]
    kind = doc["kind"]
    if kind in ("StatefulSet", "Job"):
        misspelt["spec"]["template"]["spec"]["containers"][0]["comand"] = ["true"]
        wrong_type["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "five minutes"
        del missing["spec"]["template"]["spec"]["containers"][0]["name"]
    elif kind == "Service":
        wrong_type["spec"]["ports"][0]["port"] = "ssh"
        del missing["spec"]["ports"][0]["port"]
    elif kind == "HorizontalPodAutoscaler":
        wrong_type["spec"]["minReplicas"] = "one"
        del missing["spec"]["maxReplicas"]
    elif kind == "ConfigMap":
        wrong_type["data"] = ["not", "a", "map"]
        broken.pop()  # a ConfigMap has no required field beyond apiVersion and kind
    else:
        raise AssertionError(f"no broken copies for {kind}")
    return broken


@pytest.mark.parametrize("kind", ["StatefulSet", "Job", "ConfigMap", "Service", "HorizontalPodAutoscaler"])
def test_a_broken_copy_of_each_kind_fails(kind):
    doc = next(doc for _, doc in OBJECTS if doc["kind"] == kind)
    for what, broken in mutations(doc):
        with pytest.raises(kubernetes_validate.ValidationError):
            validate(broken)
            pytest.fail(f"a {kind} with a {what} field validated")


def test_schema_copy_names_its_source():
    schema = json.loads(MPIJOB_SCHEMA.read_text())
    assert "kubeflow/mpi-operator deploy/v2beta1/mpi-operator.yaml" in schema["$comment"]
    assert "caa3c47fc42eb762635f78045ec0fcd1a89eb038" in schema["$comment"]
    assert "mpiReplicaSpecs" in schema["properties"]["spec"]["properties"]


def strict(schema: object) -> object:
    """The CRD schema with unknown fields rejected wherever the API server would prune them."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def check_jsonschema(schema: Path, instance: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(CHECK_JSONSCHEMA), "--schemafile", str(schema), str(instance)],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def strict_schema(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("schema") / "mpijob-v2beta1-strict.json"
    path.write_text(json.dumps(strict(json.loads(MPIJOB_SCHEMA.read_text()))))
    return path


def test_mpijob_validates_against_the_crd_schema(strict_schema):
    for schema in (MPIJOB_SCHEMA, strict_schema):
        result = check_jsonschema(schema, MPIJOB)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "ok -- validation done" in result.stdout


def test_a_broken_mpijob_fails_the_crd_schema(tmp_path, strict_schema):
    (doc,) = load(MPIJOB)
    wrong_type, missing, misspelt = copy.deepcopy(doc), copy.deepcopy(doc), copy.deepcopy(doc)
    wrong_type["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = "two"
    del missing["spec"]["mpiReplicaSpecs"]
    misspelt["spec"]["slotPerWorker"] = misspelt["spec"].pop("slotsPerWorker")
    for name, broken, schema, expected in [("wrong-type", wrong_type, MPIJOB_SCHEMA, "'two' is not of type 'integer'"),
                                           ("missing", missing, MPIJOB_SCHEMA,
                                            "'mpiReplicaSpecs' is a required property"),
                                           ("misspelt", misspelt, strict_schema, "slotPerWorker")]:
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(broken))
        result = check_jsonschema(schema, path)
        assert result.returncode == 1, (name, result.stdout, result.stderr)
        assert expected in result.stdout + result.stderr, (name, result.stdout)


def test_mpijob_pod_templates_validate_as_kubernetes_pod_templates():
    (doc,) = load(MPIJOB)
    for replica, spec in doc["spec"]["mpiReplicaSpecs"].items():
        validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"mpijob-{replica.lower()}"},
                  "template": spec["template"]})
    broken = copy.deepcopy(doc["spec"]["mpiReplicaSpecs"]["Worker"]["template"])
    broken["spec"]["initContainers"][1]["restartPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "broken"}, "template": broken})


def test_kustomizations_list_every_manifest_of_their_folder():
    for kustomization in sorted(K8S.glob("*/kustomization.yaml")):
        (doc,) = load(kustomization)
        assert doc["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and doc["kind"] == "Kustomization"
        listed = set()
        for entry in doc["resources"]:
            target = (kustomization.parent / entry).resolve()
            assert target.exists(), f"{kustomization}: {entry} does not exist"
            if target.is_dir():
                assert (target / "kustomization.yaml").exists(), f"{kustomization}: {entry} has no kustomization.yaml"
            listed.add(target)
        own = {p.resolve() for p in kustomization.parent.glob("*.yaml") if p.name != "kustomization.yaml"}
        # hpa-example.yaml is opt-in (its kustomization says so): every other manifest is applied.
        assert own - listed <= {(kustomization.parent / "hpa-example.yaml").resolve()}, own - listed
    assert set(manifest_files()) >= {K8S / "statefulset" / "hpa-example.yaml", MPIJOB}


def test_setup_cfg_ships_every_manifest_in_its_folder():
    import configparser

    setup = configparser.ConfigParser()
    setup.read(K8S.parents[1] / "setup.cfg")
    shipped = {(target, entry) for target, files in setup["options.data_files"].items()
               for entry in files.split()}
    expected = {(f"share/hvd-elastic/k8s/{path.parent.name}", str(path.relative_to(K8S.parents[1])))
                for path in manifest_files()}
    assert expected <= shipped, expected - shipped
