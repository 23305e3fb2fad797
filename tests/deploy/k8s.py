"""The Kubernetes resources of cluster/kubernetes/ and the Dask operator's CRD schemas they are
validated against (the dask-kubernetes package ships them), shared by test_kubernetes.py and
test_helm.py."""

import copy
import functools
import re
import tomllib
from importlib.resources import files
from pathlib import Path

import jsonschema
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "cluster" / "kubernetes"
CRDS = "operator/deployment/helm/dask-kubernetes-operator/crds"
RESOURCES = {"DaskCluster": "daskcluster.yaml", "DaskWorkerGroup": "daskworkergroup.yaml"}
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are large
CREDENTIAL = re.compile(r"^AWS_|KEY|SECRET|TOKEN|PASSWORD|CREDENTIAL", re.IGNORECASE)


def strict(schema):
    """``schema`` refusing fields it does not declare, as ``kubectl apply --validate=strict``
    does (a CRD's structural schema alone prunes them silently)."""
    schema = copy.deepcopy(schema)
    # every Kubernetes object has these, which CRD schemas leave implicit
    schema["properties"] |= {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
    }

    def walk(node):
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


@functools.cache
def crd_schema(kind):
    """The openAPIV3Schema of ``kind`` as the installed dask-kubernetes ships it."""
    crd = yaml.load((files("dask_kubernetes") / CRDS / RESOURCES[kind]).read_text(), Loader=LOADER)
    assert crd["spec"]["names"]["kind"] == kind
    (version,) = [v for v in crd["spec"]["versions"] if v["served"] and v["storage"]]
    return crd["spec"]["group"] + "/" + version["name"], version["schema"]["openAPIV3Schema"]


@functools.cache
def validator(kind):
    """``(apiVersion, strict validator)`` of the operator's resource ``kind``."""
    api, schema = crd_schema(kind)
    return api, jsonschema.Draft7Validator(strict(schema))


def crd_errors(resource):
    """What the operator's CRD schema refuses in ``resource`` (empty: valid)."""
    api, check = validator(resource["kind"])
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in check.iter_errors(resource)]
    if resource["apiVersion"] != api:
        errors.append(f"apiVersion {resource['apiVersion']} is not the CRD's {api}")
    return errors


def load(kind):
    """The checked-in resource of ``kind`` (cluster/kubernetes/)."""
    return yaml.safe_load((K8S / RESOURCES[kind]).read_text())


def containers(resource):
    """The containers of a DaskCluster's or DaskWorkerGroup's pods, by name."""
    spec = resource["spec"]
    pods = [spec["worker"]["spec"]] + ([spec["scheduler"]["spec"]] if "scheduler" in spec else [])
    return {c["name"]: c for pod in pods for c in pod["containers"]}


def env(container):
    """A container's environment entries, by name."""
    return {e["name"]: e for e in container.get("env", [])}
