"""cluster/kubernetes/helm/: dl1's chart and the values for Dask's classic chart, rendered by
Helm itself (its Go SDK, through helm-python-sdk: no helm binary, no Kubernetes cluster).

- dl1's chart (helm/dl1) renders the operator's resources, valid under the operator's CRD
  schemas, and the network policy, all equal to cluster/kubernetes/*.yaml; its
  values.schema.json refuses bad values.
- dask-values.yaml, rendered with the published `dask/dask` chart 2024.1.1 (vendored in
  tests/deploy/charts/, checked against the digest of helm.dask.org's index), gives pods of
  valid Kubernetes pod specs carrying the same settings and credentials.
"""

import copy
import functools
import hashlib
import json
import subprocess
from importlib.metadata import entry_points
from pathlib import Path

import jsonschema
import pytest
import yaml
from dask.utils import parse_bytes

from dl1.deploy import worker_settings
from tests.deploy.k8s import (
    CREDENTIAL,
    K8S,
    RESOURCES,
    VERSION,
    containers,
    crd_errors,
    crd_schema,
    env,
    load,
    strict,
)

CHART = K8S / "helm" / "dl1"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
SCHEMA = json.loads((CHART / "values.schema.json").read_text())

DASK_CHART = Path(__file__).parent / "charts" / "dask-2024.1.1.tgz"
#: sha256 of dask-2024.1.1.tgz in https://helm.dask.org/index.yaml
DASK_CHART_DIGEST = "33b5ef503c6cc08a8c6f641d605ff4b993ff25f7b1aa113200f7f73cdc28581e"
DASK_VALUES = yaml.safe_load((K8S / "helm" / "dask-values.yaml").read_text())

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


def _preloads(args):
    return [args[i + 1] for i, a in enumerate(args) if a == "--preload"]


def _dask_chart(helm):
    data = DASK_CHART.read_bytes()
    assert hashlib.sha256(data).hexdigest() == DASK_CHART_DIGEST
    return helm.Chart.load_archive(data)


def _leaves(values, path=()):
    """Paths of the values a user sets (a list is one value)."""
    for key, value in values.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, (*path, key))
        else:
            yield (*path, key)


def _changed(value):
    """Another value of the same type."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | str):
        return value + type(value)(1)
    return [*value, "changed"]


def _unread(helm, chart, values):
    """Keys of ``values`` the chart does not read (Helm drops unknown keys silently): those
    whose change leaves the rendered chart as it was."""
    base = chart.render(values, name="dl1")
    unread = []
    for path in _leaves(values):
        changed = copy.deepcopy(values)
        node = functools.reduce(dict.__getitem__, path[:-1], changed)
        node[path[-1]] = _changed(node[path[-1]])
        try:
            if chart.render(changed, name="dl1") == base:
                unread.append(".".join(path))
        except helm.HelmError:  # read, and refused
            pass
    return unread


def _dask_pods(helm, values):
    """The dask chart rendered for ``values``: {component: pod spec}, and its other resources."""
    out = _dask_chart(helm).render(values, name="dl1", namespace="dl1-ns", is_install=True)
    docs = [d for n, t in out.items() if n.endswith(".yaml") for d in yaml.safe_load_all(t) if d]
    pods = {d["metadata"]["labels"]["component"]: d["spec"]["template"]["spec"]
            for d in docs if d["kind"] == "Deployment"}  # fmt: skip
    return pods, [d for d in docs if d["kind"] != "Deployment"]


def test_every_dask_chart_value_is_read_by_the_chart(helm):
    chart = _dask_chart(helm)
    assert _unread(helm, chart, DASK_VALUES) == []
    misspelt = {**DASK_VALUES, "worker": {**DASK_VALUES["worker"], "thread_per_worker": 1}}
    assert _unread(helm, chart, misspelt) == ["worker.thread_per_worker"]


def test_the_dask_charts_pods_carry_dl1s_settings_and_credentials(helm):
    pods, others = _dask_pods(helm, DASK_VALUES)
    assert set(pods) == {"scheduler", "worker"}  # no Jupyter
    (service,) = others
    assert service["kind"] == "Service" and service["spec"]["type"] == "ClusterIP"
    pod_schema = crd_schema("DaskCluster")[1]["properties"]["spec"]["properties"]["worker"]
    check = jsonschema.Draft7Validator(strict(pod_schema["properties"]["spec"]))
    operator = {c: load("DaskCluster")["spec"][c]["spec"] for c in pods}
    for component, pod in pods.items():
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in check.iter_errors(pod)]
        assert errors == [], component
        assert pod["securityContext"] == operator[component]["securityContext"]
        (container,) = pod["containers"]
        (same,) = operator[component]["containers"]
        assert container["env"] == same["env"], component  # the operator's resources' own
        assert container["image"] == f"dl1:{VERSION}"
        assert container["resources"] == same["resources"]
    worker, scheduler = pods["worker"]["containers"][0], pods["scheduler"]["containers"][0]
    args = worker["args"]
    assert _preloads(args) == _preloads(worker_settings().args)
    assert args[args.index("--nthreads") + 1] == "1" and "--no-dashboard" in args
    limit = worker["resources"]["limits"]["memory"]
    assert parse_bytes(args[args.index("--memory-limit") + 1]) == parse_bytes(limit + "B")
    assert args[args.index("--local-directory") + 1] == "/scratch"
    assert {m["mountPath"] for m in worker["volumeMounts"]} == {"/scratch"}
    assert "--no-dashboard" in scheduler["args"] and "dl1.runtime.nohttp" in scheduler["args"]
    for entry in worker["env"]:
        assert not (CREDENTIAL.search(entry["name"]) and "value" in entry), entry["name"]


def test_the_image_runs_the_commands_the_dask_chart_runs(helm, tmp_path):
    pods, _ = _dask_pods(helm, DASK_VALUES)
    commands = {pod["containers"][0]["args"][0]: c for c, pod in pods.items()}
    assert commands == {"dask-scheduler": "scheduler", "dask-worker": "worker"}
    assert set(commands.values()) <= {e.name for e in entry_points(group="dask_cli")}
    # a `dask` that prints its arguments, one a line
    (tmp_path / "dask").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    dockerfile = (K8S / "Dockerfile").read_text()
    for command, sub in commands.items():
        # the Dockerfile's own shell line writing the command, run into tmp_path
        (line,) = [ln for ln in dockerfile.splitlines() if f"> /usr/local/bin/{command} " in ln]
        script = line.strip().removeprefix("&& ").removesuffix("\\").strip()
        subprocess.run(["sh", "-c", script.replace("/usr/local/bin/", f"{tmp_path}/")], check=True)
        for name in (command, "dask"):
            (tmp_path / name).chmod(0o755)
        args = ["tcp://s:8786", "--memory-limit", "4 GiB"]
        out = subprocess.run(
            [tmp_path / command, *args], capture_output=True, text=True, check=True, timeout=10,
            env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
        )  # fmt: skip
        assert out.stdout.splitlines() == [sub, *args]
