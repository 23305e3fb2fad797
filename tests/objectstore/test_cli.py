"""The command line on a store in S3 (the session's moto server): ``dl1 convert`` writes
it, ``dl1 info`` reads it, ``dl1 fit`` fits it on workers that read the bucket, ``dl1
score`` scores the saved model there; ``--storage-options`` reach the filesystem and are
never printed."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner
from sklearn.datasets import dump_svmlight_file
from sklearn.metrics import r2_score

import dl1
from dl1.cli import cli
from tests.helpers import random_csr


def invoke(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return result, json.loads(result.stdout)


@pytest.fixture
def scheduler(s3_cluster) -> str:
    """The address of the session's S3 cluster (its workers inherit ``AWS_*``)."""
    return s3_cluster.scheduler.address


@pytest.mark.slow
def test_convert_info_fit_score_on_s3(s3_bucket, scheduler, tmp_path):
    X = random_csr(120, 30, 0.2, seed=5)
    y = X @ np.r_[np.ones(3), np.zeros(27)] + 0.01 * np.cos(np.arange(120))
    src = tmp_path / "a.svm"
    dump_svmlight_file(X, y, str(src), zero_based=True)
    url = f"{s3_bucket}/a.zarr"
    options = json.dumps({"endpoint_url": os.environ["AWS_ENDPOINT_URL"],
                          "key": "dl1-test", "secret": "dl1-test-secret"})  # fmt: skip
    _, converted = invoke("convert", src, url, "--zero-based", "true", "--json",
                          "--storage-options", options)  # fmt: skip
    _, local = invoke("convert", src, tmp_path / "a.zarr", "--zero-based", "true", "--json")
    assert converted["store"].startswith(s3_bucket) and converted["splits"] == local["splits"]
    text, info = invoke("info", url, "--json")  # credentials from the environment
    assert info["splits"] == local["splits"] and "120 x 30" in text.stderr
    fit, doc = invoke("fit", url, "--scheduler", scheduler, "--json", "--output", tmp_path / "m",
                      "--storage-options", options)  # fmt: skip
    assert doc["certified"] and doc["store"].startswith(s3_bucket)
    model = dl1.load_model(tmp_path / "m")
    n = X.shape[0]
    primal = (np.sum((y - X @ model.coef_ - model.intercept_) ** 2) / (2 * n)
              + doc["alpha"] * np.abs(model.coef_).sum())  # fmt: skip
    assert primal == pytest.approx(doc["primal"], rel=1e-12)
    _, scored = invoke("score", tmp_path / "m", url, "--scheduler", scheduler, "--json")
    assert scored["split"] == "train"
    r2 = r2_score(y, X @ model.coef_ + model.intercept_)
    assert scored["score"] == pytest.approx(r2, rel=1e-12)
    for out in (fit.stdout, fit.stderr, text.stdout, text.stderr):
        assert "dl1-test-secret" not in out
