"""cluster/kubernetes/: the Dask operator's resources for a dl1 cluster, validated against the
CRD schemas the dask-kubernetes package ships, and checked for dl1's settings, a pinned image
and credentials taken from a Secret by reference."""

import re

import pytest
import yaml
from dask.utils import parse_bytes

from dl1.deploy import worker_settings
from dl1.runtime.localcluster import CLUSTER_CONFIG, NO_HTTP_CONFIG
from tests.deploy.k8s import (
    CREDENTIAL,
    K8S,
    PYPROJECT,
    RESOURCES,
    VERSION,
    containers,
    crd_errors,
    env,
    load,
    validator,
)


def _preloads(args):
    return [args[i + 1] for i, a in enumerate(args) if a == "--preload"]


def _config_env(key):
    """The environment variable Dask reads a config key from."""
    return "DASK_" + key.upper().replace(".", "__").replace("-", "_")


@pytest.mark.parametrize("kind", sorted(RESOURCES))
def test_each_resource_is_valid_under_the_operators_crd(kind):
    resource = load(kind)
    assert resource["kind"] == kind
    assert crd_errors(resource) == []


@pytest.mark.parametrize(
    "path, value, message",
    [
        (["spec", "worker", "replicas"], "two", "is not of type 'integer'"),
        (["spec", "worker", "spec", "containers", 0, "args"], "dask worker", "not of type 'array'"),
        (["spec", "worker", "replica"], 2, "Additional properties are not allowed"),
    ],
)
def test_the_validator_refuses_a_wrong_type_or_an_unknown_field(path, value, message):
    _, check = validator("DaskCluster")
    resource = load("DaskCluster")
    node = resource
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    errors = [e.message for e in check.iter_errors(resource)]
    assert any(message in e for e in errors), errors


def test_the_workers_carry_dl1s_settings_and_the_memory_they_are_given():
    cluster, group = load("DaskCluster"), load("DaskWorkerGroup")
    assert group["spec"]["cluster"] == cluster["metadata"]["name"]
    assert group["spec"]["worker"]["spec"] == cluster["spec"]["worker"]["spec"]
    worker = containers(cluster)["worker"]
    settings = worker_settings(host=None)  # pods listen on their pod's address
    worker_env = env(worker)
    for key, value in settings.env.items():
        assert worker_env[key] == {"name": key, "value": value}
    args = worker["args"]
    assert args[:2] == ["dask", "worker"]
    assert _preloads(args) == _preloads(settings.args)
    assert "--no-dashboard" in args and args[args.index("--nthreads") + 1] == "1"
    limit = parse_bytes(args[args.index("--memory-limit") + 1])
    resources = worker["resources"]
    assert parse_bytes(resources["limits"]["memory"] + "B") == limit
    assert resources["requests"] == resources["limits"] and resources["limits"]["cpu"] == "1"


def test_the_scheduler_steals_no_work_and_serves_no_http():
    cluster = load("DaskCluster")
    scheduler = containers(cluster)["scheduler"]
    scheduler_env = env(scheduler)
    expected = {**CLUSTER_CONFIG, "distributed.scheduler.http.routes": []}
    for key, value in expected.items():
        if key.startswith("distributed.scheduler."):
            assert yaml.safe_load(scheduler_env[_config_env(key)]["value"]) == value, key
    assert NO_HTTP_CONFIG["distributed.scheduler.http.routes"] == []
    assert "--no-dashboard" in scheduler["args"] and "dl1.runtime.nohttp" in scheduler["args"]
    ports = {p["name"] for p in scheduler["ports"]}
    service = cluster["spec"]["scheduler"]["service"]
    assert ports == {"tcp-comm"} and {p["name"] for p in service["ports"]} == {"tcp-comm"}
    assert service["type"] == "ClusterIP"
    for probe in ("readinessProbe", "livenessProbe"):
        assert scheduler[probe]["tcpSocket"]["port"] == "tcp-comm"


@pytest.mark.parametrize("kind", sorted(RESOURCES))
def test_credentials_come_from_a_secret_by_reference(kind):
    resource = load(kind)
    worker = containers(resource)["worker"]
    refs = {}
    for container in containers(resource).values():
        for name, entry in env(container).items():
            if CREDENTIAL.search(name):
                assert "value" not in entry, f"{name} is written in {RESOURCES[kind]}"
                refs[name] = entry["valueFrom"]["secretKeyRef"]
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(env(worker))
    assert {r["name"] for r in refs.values()} == {"dl1-store-credentials"}
    for path in K8S.glob("*.yaml"):  # no Secret with its data in the repository
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc.get("kind") != "Secret", path


def test_the_image_is_pinned_to_this_release():
    for kind in RESOURCES:
        for container in containers(load(kind)).values():
            assert container["image"] == f"dl1:{VERSION}"
    requirements = {}
    for line in (K8S / "requirements.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, spec = re.match(r"([A-Za-z0-9_.\-]+(?:\[[a-z0-9,]+\])?)(.*)", line).groups()
            requirements[name] = spec
    assert requirements.pop("dl1[s3]") == f"=={VERSION}"
    deps = {re.match(r"[^<>=!~ ]+", d).group(): d for d in PYPROJECT["project"]["dependencies"]}
    for name, spec in requirements.items():
        assert deps[name] == name + spec, name
    dockerfile = (K8S / "Dockerfile").read_text()
    assert f"-t dl1:{VERSION}" in dockerfile and "cluster/kubernetes/requirements.txt" in dockerfile
    # the image caches the kernels after the install, where the pods' user finds them (its
    # own ~/.cache is not root's), and gives that user the cache before switching to it
    assert "ENV NUMBA_CACHE_DIR=/opt/dl1/numba-cache" in dockerfile
    order = ["ENV NUMBA_CACHE_DIR", "pip install", "&& dl1 warm", "chown -R 1000:1000 /opt/dl1",
             "USER 1000"]
    assert [dockerfile.index(s) for s in order] == sorted(dockerfile.index(s) for s in order)
