"""Every command in process (click's runner) against the session's cluster: ``--json``
gives exactly one JSON document on stdout and the human text on stderr; results equal an
independent reference (closed form, scikit-learn); exit statuses are as README states
(0 success, 2 invalid input, 1 any other error)."""

from __future__ import annotations

import json
import re
import sys

import dask
import numpy as np
import pytest
from click.testing import CliRunner
from sklearn.linear_model import Lasso
from sklearn.metrics import accuracy_score, r2_score

import dl1
from dl1.cli import cli


def invoke(*args, ok: bool = True):
    """``dl1 *args`` in process; stdout and stderr kept apart."""
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    if ok:
        assert result.exit_code == 0, result.stderr
    return result


def document(result) -> dict:
    """stdout as exactly one JSON document (json.loads refuses anything around it)."""
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def model(reg, scheduler, tmp_path_factory):
    """``dl1 fit --json --output``: the saved model's directory and the JSON document."""
    path = tmp_path_factory.mktemp("cli-model") / "lasso"
    result = invoke("fit", reg.path, "--alpha-ratio", "8", "--output", path, "--json",
                    "--scheduler", scheduler)  # fmt: skip
    assert "certificate: duality gap" in result.stderr  # the human text, on stderr
    assert re.search(r"^\d{4}-\d\d-\d\dT[\d:]{8}Z fit round \d+  gap ", result.stderr, re.M)
    return path, document(result)


@pytest.mark.slow
def test_fit_json_and_saved_model_match_the_objective_and_sklearn(reg, model):
    path, doc = model
    fitted = dl1.load_model(path)
    assert doc["ok"] and doc["certified"] and doc["model"] == str(path)
    assert doc["n_nonzero"] == np.count_nonzero(fitted.coef_) and doc["n_features"] == 40
    assert doc["alpha"] == pytest.approx(doc["alpha_max"] / 8, rel=1e-12)
    n, a = reg.X.shape[0], doc["alpha"]

    def objective(w, b):
        return np.sum((reg.y - reg.X @ w - b) ** 2) / (2 * n) + a * np.abs(w).sum()

    assert objective(fitted.coef_, fitted.intercept_) == pytest.approx(doc["primal"], rel=1e-10)
    sk = Lasso(alpha=a, tol=1e-12, max_iter=100_000).fit(reg.X, reg.y)
    gap = doc["duality_gap"]
    assert 0 <= objective(fitted.coef_, fitted.intercept_) - objective(sk.coef_, sk.intercept_)
    assert objective(fitted.coef_, fitted.intercept_) - objective(sk.coef_, sk.intercept_) <= gap
    mse = np.mean((reg.y_test - reg.X_test @ fitted.coef_ - fitted.intercept_) ** 2)
    assert doc["test_mse"] == pytest.approx(mse, rel=1e-10)


def test_predict_writes_every_row_block_of_the_npy(reg, model, scheduler, tmp_path):
    path, _ = model
    fitted = dl1.load_model(path)
    out = tmp_path / "pred.npy"
    result = invoke("predict", path, reg.path, "--output", out, "--json", "--scheduler", scheduler)
    doc = document(result)
    assert doc["output"] == str(out) and doc["n_samples"] == 70 and doc["split"] == "test"
    np.testing.assert_allclose(
        np.load(out), reg.X_test @ fitted.coef_ + fitted.intercept_, rtol=1e-12, atol=1e-14
    )
    n_blocks = dl1.open_store(reg.path).block_nnz("test").shape[0]
    assert n_blocks == 2
    lines = [ln for ln in result.stderr.splitlines() if "row block" in ln]
    assert len(lines) == n_blocks and lines[-1].split()[2] == f"{n_blocks}/{n_blocks}"
    # the train split, without --json: the human line on stdout
    result = invoke("predict", path, reg.path, "--split", "train", "--output", out,
                    "--overwrite", "--scheduler", scheduler)  # fmt: skip
    assert "160 predictions" in result.stdout
    np.testing.assert_allclose(np.load(out), reg.X @ fitted.coef_ + fitted.intercept_,
                               rtol=1e-12, atol=1e-14)  # fmt: skip


def test_score_is_r2_or_accuracy_as_sklearn(reg, clf, model, scheduler, local_cluster, tmp_path):
    path, _ = model
    fitted = dl1.load_model(path)
    doc = document(invoke("score", path, reg.path, "--json", "--scheduler", scheduler))
    expected = r2_score(reg.y_test, reg.X_test @ fitted.coef_ + fitted.intercept_)
    assert doc["metric"] == "r2" and doc["score"] == pytest.approx(expected, rel=1e-12)

    res = dl1.fit(clf.path, alpha=0.01, loss="logistic", tol=1e-6, client=local_cluster)
    res.save(tmp_path / "logit")
    result = invoke("score", tmp_path / "logit", clf.path, "--scheduler", scheduler)
    labels = np.where(clf.X_test @ res.coef_ + res.intercept_ >= 0, 1.0, -1.0)
    acc = accuracy_score(clf.y_test, labels)
    assert result.stdout.split()[:2] == ["accuracy", f"{acc:.6g}"]
    out = tmp_path / "labels.npy"
    invoke("predict", tmp_path / "logit", clf.path, "--output", out, "--scheduler", scheduler)
    np.testing.assert_array_equal(np.load(out), labels)


def test_path_json_saved_path_and_predict_at_a_grid_alpha(reg, scheduler, tmp_path):
    result = invoke("path", reg.path, "--n-alphas", "4", "--json", "--output", tmp_path / "p",
                    "--plots", tmp_path / "plots", "--scheduler", scheduler)  # fmt: skip
    doc = document(result)
    assert doc["n_alphas"] == 4 and all(doc["certified"]) and len(doc["alphas"]) == 4
    assert len(doc["plots"]) == 3 and "best alpha" in result.stderr
    lines = [ln for ln in result.stderr.splitlines() if " path " in ln and " alpha " in ln]
    assert [ln.split()[2] for ln in lines] == ["1/4", "2/4", "3/4", "4/4"]
    saved = dl1.load_model(tmp_path / "p")
    np.testing.assert_array_equal(saved.alphas_, doc["alphas"])
    a = doc["alphas"][2]
    invoke("predict", tmp_path / "p", reg.path, "--alpha", repr(a), "--output",
           tmp_path / "y.npy", "--scheduler", scheduler)  # fmt: skip
    m = saved.model(a)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"),
                               reg.X_test @ m.coef_ + m.intercept_, rtol=1e-12)  # fmt: skip


def test_convert_and_info_json(tmp_path):
    src = tmp_path / "a.svm"
    src.write_text("1 1:0.5 3:2\n-1 2:1.5\n2.5\n")
    result = invoke("convert", src, tmp_path / "s", "--json")
    doc = document(result)
    expected = {"n_samples": 3, "n_features": 3, "nnz": 3, "dtype": "float64",
                "blocks": [1, 1], "formats": ["csc"]}  # fmt: skip
    assert doc["splits"]["train"] == expected
    assert "converted" in result.stderr and "3 x 3" in result.stderr
    assert re.search(r"Z convert written in [\d.]+ s$", result.stderr, re.M)
    info = invoke("info", tmp_path / "s", "--json")
    assert document(info)["splits"] == doc["splits"] and "3 x 3" in info.stderr
    assert "3 x 3" in invoke("info", tmp_path / "s").stdout  # no --json: text on stdout


@pytest.fixture
def places(tmp_path, reg, model):
    """Paths for the exit-status cases."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("not a store")
    (tmp_path / "exists.npy").write_bytes(b"")
    return {"s": reg.path, "m": model[0], "t": tmp_path}


SECRET = "AKIA-not-a-real-key-123"

CASES = [
    # usage errors and invalid input: 2
    (["fit"], 2, "Missing argument"),
    (["fit", "{s}", "--tol", "0"], 2, "'tol' parameter of dl1 fit"),
    (["info", "{t}/missing"], 2, "no dl1 store"),
    (["info", "{t}/empty"], 2, "dl1-manifest.json"),
    (["info", "{t}/notes"], 2, "dl1-manifest.json"),
    (["predict", "{t}/notes", "{s}", "--output", "{t}/p.npy"], 2, "model"),
    (["predict", "{m}", "{s}", "--output", "{t}/p.txt"], 2, ".npy"),
    (["score", "{m}", "{s}", "--split", "valid"], 2, "no split 'valid'"),
    (["fit", "{s}", "--scheduler", "tls://127.0.0.1:9"], 2, "the CA certificate"),
    (["info", "{s}", "--storage-options", "[" + SECRET], 2, "must be a JSON object"),
    (["fit", "{s}", "--slurm-queue", "debug"], 2, "need --cluster slurm"),
    (["fit", "{s}", "--scheduler", "tcp://h:9", "--scheduler-file", "{t}/f"], 2, "not both"),
    (["fit", "{s}", "--scheduler-file", "{t}/notes/readme.txt"], 2, "is not JSON"),
    # anything else: 1
    (["fit", "{s}", "--scheduler", "tcp://127.0.0.1:9"], 1, "tcp://127.0.0.1:9"),
    (["predict", "{m}", "{s}", "--output", "{t}/exists.npy"], 1, "exists"),
    (["generate", "{s}"], 1, "reg.zarr"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "status", "named"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_exit_status_one_line_and_json_error(places, args, status, named):
    args = [a.format(**places) for a in args]
    with dask.config.set({"distributed.comm.timeouts.connect": "2s"}):
        result = invoke(*args, ok=False)
        as_json = invoke(*args, "--json", ok=False)
    assert result.exit_code == status, result.stderr
    lines = result.stderr.strip().splitlines()
    assert named in result.stderr and "Traceback" not in result.stderr
    if status == 1 or "Error:" not in result.stderr:  # dl1's own errors: one line
        assert len(lines) == 1 and lines[0].startswith("dl1: error: "), lines
    assert SECRET not in result.stderr + result.stdout + as_json.stdout + as_json.stderr
    doc = document(as_json)
    assert as_json.exit_code == status and doc["ok"] is False and doc["exit_status"] == status
    assert named in doc["error"] or named in as_json.stderr


def test_cluster_slurm_without_jobqueue_is_one_line(reg, monkeypatch):
    monkeypatch.setitem(sys.modules, "dl1.deploy.jobqueue", None)  # import fails
    result = invoke("fit", reg.path, "--cluster", "slurm", "--slurm-queue", "debug", ok=False)
    assert result.exit_code == 1
    assert result.stderr.startswith("dl1: error: --cluster slurm needs dask-jobqueue")


def test_scheduler_file_joins_the_running_cluster(reg, model, scheduler, tmp_path):
    path, _ = model
    (tmp_path / "scheduler.json").write_text(json.dumps({"address": scheduler}))
    doc = document(invoke("score", path, reg.path, "--scheduler-file",
                          tmp_path / "scheduler.json", "--json"))  # fmt: skip
    assert doc["metric"] == "r2" and doc["n_samples"] == 70
