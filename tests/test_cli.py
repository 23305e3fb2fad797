"""The dl1 command line, run as a user runs it (subprocesses)."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import dl1
from tests.helpers import random_csr

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def run(*args, check=True):
    out = subprocess.run(
        [sys.executable, "-m", "dl1", *map(str, args)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check:
        assert out.returncode == 0, out.stderr
    return out


@pytest.mark.slow
def test_demo_generates_fits_and_certifies():
    out = run("demo", "--workers", "2").stdout
    assert "2,000 x 50,000" in out
    assert "certified at tol 1e-06" in out
    assert "test: MSE" in out


def test_info_reports_shape_nnz_blocks_and_column_frequencies(tmp_path):
    X = random_csr(50, 30, 0.2, seed=1, empty_cols=(4,))
    dl1.from_scipy(X, np.zeros(50), tmp_path / "s", n_feature_blocks=3)
    out = run("info", tmp_path / "s").stdout
    assert "50 x 30" in out
    assert f"nnz            {X.nnz:,}" in out
    assert "1 row x 3 feature blocks" in out
    assert "empty columns  1" in out
    assert "top 1% of columns hold" in out


@pytest.mark.slow
def test_convert_svmlight_and_errors_are_one_line(tmp_path):
    src = tmp_path / "a.svm"
    src.write_text("1 1:0.5 3:2\n-1 2:1.5\n2.5\n")
    out = run("convert", src, tmp_path / "s").stdout
    assert "3 x 3" in out
    X, y = dl1.open(tmp_path / "s")
    np.testing.assert_array_equal(
        X.compute().toarray(), sp.csr_matrix([[0.5, 0, 2], [0, 1.5, 0], [0, 0, 0]]).toarray()
    )
    np.testing.assert_array_equal(y.compute(), [1, -1, 2.5])
    bad = tmp_path / "b.svm"
    bad.write_text("1 1:0.5\n1 2:x\n")
    out = run("convert", bad, tmp_path / "t", check=False)
    assert out.returncode == 2  # invalid input
    assert "line 2" in out.stderr and "Traceback" not in out.stderr
    out = run("convert", src, tmp_path / "s", check=False)
    assert out.returncode == 1 and "fresh path" in out.stderr


@pytest.mark.slow
def test_fit_command_on_a_store(tmp_path):
    X = random_csr(200, 60, 0.1, seed=2)
    y = X @ np.r_[np.ones(4), np.zeros(56)]
    dl1.from_scipy(X, y, tmp_path / "s", n_feature_blocks=2)
    out = run("fit", tmp_path / "s", "--alpha-ratio", "10", "--workers", "1").stdout
    assert "certified at tol 1e-06" in out
    assert "alpha_max/10" in out


@pytest.mark.slow
def test_path_command_with_checkpoint_and_plots(tmp_path):
    X = random_csr(150, 40, 0.15, seed=3)
    y = X @ np.r_[np.ones(5), np.zeros(35)] + 0.01 * np.arange(150) % 0.1
    Xt = random_csr(40, 40, 0.15, seed=4)
    dl1.from_scipy(X, y, tmp_path / "s", X_test=Xt, y_test=Xt @ np.r_[np.ones(5), np.zeros(35)])
    out = run(
        "path",
        tmp_path / "s",
        "--n-alphas",
        "8",
        "--workers",
        "1",
        "--checkpoint",
        tmp_path / "ck",
        "--plots",
        tmp_path / "plots",
    ).stdout
    assert "best alpha" in out and "test_mse" in out
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "coefficient_paths.png",
        "support_and_gap.png",
        "validation.png",
    ]
    # rerun resumes from the complete checkpoint and gives the same table
    again = run(
        "path",
        tmp_path / "s",
        "--n-alphas",
        "8",
        "--workers",
        "1",
        "--checkpoint",
        tmp_path / "ck",
        "--plots",
        tmp_path / "plots",
    ).stdout
    strip = [ln.split()[:5] for ln in out.splitlines() if ln[:4].strip().isdigit()]
    assert strip == [ln.split()[:5] for ln in again.splitlines() if ln[:4].strip().isdigit()]


@pytest.mark.slow
def test_path_command_frank_wolfe(tmp_path):
    X = random_csr(150, 40, 0.15, seed=3)
    y = X @ np.r_[np.ones(5), np.zeros(35)] + 0.01 * np.arange(150) % 0.1
    Xt = random_csr(40, 40, 0.15, seed=4)
    dl1.from_scipy(X, y, tmp_path / "s", X_test=Xt, y_test=Xt @ np.r_[np.ones(5), np.zeros(35)])
    out = run(
        "path", tmp_path / "s", "--constrained", "--sample", "0.5", "--n-alphas", "6",
        "--workers", "1", "--plots", tmp_path / "plots", "--tol", "1e-2",
    ).stdout  # fmt: skip
    # (at the default tol 1e-6 Frank-Wolfe's O(1/k) needs 10,000 iterations at the largest
    # radii: minutes of round trips that test nothing more of the command line)
    rows = [ln.split() for ln in out.splitlines() if ln[:4].strip().isdigit()]
    assert len(rows) == 6
    assert any(ln.split()[:3] == ["k", "delta", "alpha"] for ln in out.splitlines())
    deltas = [float(r[1]) for r in rows]
    assert deltas == sorted(deltas)
    assert (tmp_path / "plots" / "validation.png").stat().st_size > 0
    refused = run("path", tmp_path / "s", "--constrained", "--checkpoint", tmp_path / "ck",
                  check=False)  # fmt: skip
    assert refused.returncode == 2 and "--constrained takes neither" in refused.stderr
    assert "--constrained" in run("path", "--help").stdout


def test_bad_options_are_refused_before_a_cluster_starts(tmp_path):
    """Pass criterion: a bad option value exits with a usage error naming the option, not
    with a connection error to the (unreachable) scheduler it would otherwise contact
    first; a missing store is named likewise."""
    X = random_csr(40, 20, 0.2, seed=2)
    dl1.from_scipy(X, np.arange(40.0), tmp_path / "s", n_feature_blocks=2)
    nowhere = ["--scheduler", "tcp://127.0.0.1:9"]
    out = run("fit", tmp_path / "s", "--tol", "0", *nowhere, check=False)
    assert out.returncode == 2 and "'tol' parameter of dl1 fit" in out.stderr, out.stderr
    out = run("path", tmp_path / "s", "--eps", "2", *nowhere, check=False)
    assert out.returncode == 2 and "'eps' parameter of dl1 path" in out.stderr, out.stderr
    out = run("fit", tmp_path / "missing", *nowhere, check=False)
    assert out.returncode != 0 and "missing" in out.stderr and "Traceback" not in out.stderr
