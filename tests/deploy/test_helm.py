"""cluster/kubernetes/helm/dl1: dl1's chart, rendered by Helm itself (its Go SDK, through
helm-python-sdk: no helm binary, no Kubernetes cluster).

The chart renders the operator's resources, valid under the operator's CRD schemas, and the
network policy, all equal to cluster/kubernetes/*.yaml; its values.schema.json refuses bad
values, as Helm does.
"""

import json

import jsonschema
import pytest
import yaml

from tests.deploy.k8s import (
    CREDENTIAL,
    K8S,
    RESOURCES,
    containers,
    crd_errors,
    env,
)

CHART = K8S / "helm" / "dl1"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
SCHEMA = json.loads((CHART / "values.schema.json").read_text())

#: Values the chart's schema refuses, and the words of jsonschema's refusal.
BAD_VALUES = [
    ({"worker": {"memroy": "4Gi"}}, "Additional properties are not allowed"),
    ({"worker": {"memory": "4GB"}}, "does not match"),
    ({"worker": {"replicas": "two"}}, "is not of type 'integer'"),
    ({"image": {"pullPolicy": "Sometimes"}}, "is not one of"),
    ({"store": {"secretName": "Not A Name"}}, "does not match"),
]


def _merged(override):
    """The chart's default values with ``override`` merged in, as Helm merges ``-f`` files."""

    def merge(base, extra):
        return {
            k: merge(base[k], v) if isinstance(v, dict) and k in base else v
            for k, v in {**base, **extra}.items()
        }

    return merge(VALUES, override)


@pytest.fixture(scope="module")
def helm():
    return pytest.importorskip(
        "helm_python", reason="rendering the chart needs helm-python-sdk (Helm's Go SDK)"
    )


def _render(helm, values=None):
    """The chart rendered by Helm for the release ``dl1``: its resources, by kind."""
    chart = helm.Chart.load(CHART)
    out = chart.render(values, name="dl1", namespace="dl1-ns", is_install=True)
    manifests = [text for name, text in out.items() if name.endswith(".yaml")]  # not NOTES.txt
    docs = [d for text in manifests for d in yaml.safe_load_all(text) if d]
    assert len({d["kind"] for d in docs}) == len(docs)
    return {d["kind"]: d for d in docs}


def test_the_default_values_satisfy_the_charts_schema():
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    assert list(jsonschema.Draft7Validator(SCHEMA).iter_errors(VALUES)) == []


@pytest.mark.parametrize("override, message", BAD_VALUES)
def test_the_schema_refuses_a_misspelt_or_malformed_value(override, message):
    errors = [e.message for e in jsonschema.Draft7Validator(SCHEMA).iter_errors(_merged(override))]
    assert len(errors) == 1 and message in errors[0], errors


@pytest.mark.parametrize("override", [o for o, _ in BAD_VALUES])
def test_helm_refuses_the_same_values(helm, override):
    chart = helm.Chart.load(CHART)
    chart.validate_schema(VALUES)
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema(_merged(override))


def test_the_rendered_resources_are_the_checked_in_ones(helm):
    # no extra worker group unless enabled, the network policy unless disabled
    assert set(_render(helm)) == {"DaskCluster", "NetworkPolicy"}
    assert set(_render(helm, {"networkPolicy": {"enabled": False}})) == {"DaskCluster"}
    rendered = _render(helm, {"extraWorkers": {"enabled": True}})
    files = {**RESOURCES, "NetworkPolicy": "networkpolicy.yaml"}
    assert set(rendered) == set(files)
    for kind, resource in rendered.items():
        if kind in RESOURCES:
            assert crd_errors(resource) == [], kind
        checked_in = yaml.safe_load((K8S / files[kind]).read_text())
        assert resource["apiVersion"] == checked_in["apiVersion"]
        assert resource["spec"] == checked_in["spec"], kind
        assert resource["metadata"]["name"] == checked_in["metadata"]["name"]
        assert resource["metadata"]["labels"].items() >= checked_in["metadata"]["labels"].items()


def test_values_size_the_workers_and_name_the_secret(helm):
    values = {
        "image": {"repository": "registry.example/dl1", "tag": "0.1.0-r2"},
        "worker": {"replicas": 7, "memory": "16Gi", "scratch": "100Gi"},
        "scheduler": {"memory": "3Gi"},
        "extraWorkers": {"enabled": True, "replicas": 3},
        "store": {"secretName": "team-s3"},
    }
    rendered = _render(helm, values)
    cluster, group = rendered["DaskCluster"], rendered["DaskWorkerGroup"]
    assert crd_errors(cluster) == [] and crd_errors(group) == []
    assert cluster["spec"]["worker"]["replicas"] == 7 and group["spec"]["worker"]["replicas"] == 3
    assert group["spec"]["worker"]["spec"] == cluster["spec"]["worker"]["spec"]
    worker, scheduler = containers(cluster)["worker"], containers(cluster)["scheduler"]
    args = worker["args"]
    assert args[args.index("--memory-limit") + 1] == "16GiB"
    assert worker["resources"]["limits"] == worker["resources"]["requests"]
    assert worker["resources"]["limits"] == {"cpu": "1", "memory": "16Gi"}
    assert scheduler["resources"]["limits"]["memory"] == "3Gi"
    (volume,) = cluster["spec"]["worker"]["spec"]["volumes"]
    assert volume["emptyDir"]["sizeLimit"] == "100Gi"
    assert {c["image"] for c in containers(cluster).values()} == {"registry.example/dl1:0.1.0-r2"}
    secrets = set()
    for name, entry in env(worker).items():
        if CREDENTIAL.search(name):
            assert "value" not in entry, name
            secrets.add(entry["valueFrom"]["secretKeyRef"]["name"])
    assert secrets == {"team-s3"}


def test_helm_lint_finds_nothing_to_fix(helm):
    report = helm.lint(CHART, strict=True)
    assert report["errors"] == []
    # severity 2 and 3 are warnings and errors; 1 is "icon is recommended"
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
