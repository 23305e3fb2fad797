"""benchmarks/bench_multiclass.py: its NumPy certificate against dl1's own gaps, and
``--quick`` (every engine on a tiny planted problem, in a subprocess). The smoke run needs
scikit-learn, pyspark and a Java runtime; without pyspark or java it skips, saying why."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dl1

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_multiclass as bm  # noqa: E402


@pytest.mark.parametrize("l1_ratio", [1.0, 0.5])
@pytest.mark.parametrize(
    ("multi_class", "loss"),
    [("multinomial", "logistic"), ("ovr", "logistic"), ("ovr", "squared_hinge")],
)
def test_certificate_agrees_with_dl1s_gap(multi_class, loss, l1_ratio):
    X, y = bm.tiny_data(n=200, p=60, K=3)
    alpha = bm.alpha_max(X, y) / 10
    loose = dl1.fit_multiclass(X, y, alpha=alpha, l1_ratio=l1_ratio, tol=1e-2,
                               multi_class=multi_class, loss=loss, fit_intercept=False)  # fmt: skip
    res = dl1.fit_multiclass(X, y, alpha=alpha, l1_ratio=l1_ratio, tol=1e-9,
                             multi_class=multi_class, loss=loss, fit_intercept=False)  # fmt: skip
    for r in (loose, res):
        if multi_class == "multinomial":
            cert = bm.certify_multinomial(X, y, r.coef_, alpha, l1_ratio)
            assert math.isclose(cert["primal"], r.primal_, rel_tol=1e-10)
            if l1_ratio == 1.0:  # both repair the dual point, the benchmark on every column:
                # each a lower bound of the optimum (<= the tight fit's primal)
                assert max(cert["dual"], r.dual_) <= res.primal_ * (1 + 1e-12)
                assert cert["gap"] <= cert["gap_uniform"]
                continue
            assert math.isclose(cert["dual"], r.dual_, rel_tol=1e-10)
        else:
            cert = bm.certify_ovr(X, y, r.coef_, alpha, l1_ratio, loss)
            np.testing.assert_allclose(cert["gaps"], r.gaps_, rtol=1e-6, atol=1e-13)
        assert cert["gap"] == pytest.approx(r.gap_, rel=1e-6, abs=1e-13)
    assert bm.certify(
        "dl1" if multi_class == "multinomial" else
        "dl1-ovr" if loss == "logistic" else "dl1-ovr-sqh", X, y, loose.coef_, alpha, l1_ratio,
    )["gap"] > 10 * res.gap_  # fmt: skip


def test_certificate_of_sklearns_multinomial_optimum():
    """saga run to 1e-10 certifies near 0; a perturbed answer does not."""
    from sklearn.linear_model import LogisticRegression

    X, y = bm.tiny_data(n=200, p=60, K=3)
    alpha = bm.alpha_max(X, y) / 10
    m = LogisticRegression(solver="saga", C=1 / (200 * alpha), l1_ratio=1.0, tol=1e-10,
                           fit_intercept=False, max_iter=100_000).fit(X, y)  # fmt: skip
    assert bm.certify_multinomial(X, y, m.coef_, alpha)["gap"] < 1e-7
    assert bm.certify_multinomial(X, y, 1.1 * m.coef_, alpha)["gap"] > 1e-4


def test_alpha_max_is_the_threshold():
    X, y = bm.tiny_data(n=200, p=60, K=3)
    amax = bm.alpha_max(X, y)
    for factor, support in ((1.001, 0), (0.99, 1)):
        res = dl1.fit_multiclass(X, y, alpha=amax * factor, tol=1e-10, fit_intercept=False)
        assert res.coef_.nnz == support
    assert bm.resolve_alpha("C=2", X, y) == pytest.approx(1 / 400)
    with pytest.raises(ValueError, match="C=<c> or amax/<ratio>"):
        bm.resolve_alpha("alpha=3", X, y)


@pytest.mark.slow
def test_bench_multiclass_quick_runs_every_engine(tmp_path):
    pytest.importorskip("sklearn", reason="scikit-learn not installed")
    pytest.importorskip("pyspark", reason="pyspark not installed (pip install -e '.[engines]')")
    if shutil.which("java") is None:
        pytest.skip("no java on PATH: Spark needs a Java runtime")
    out = tmp_path / "multiclass.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_multiclass.py"), "--quick",
         "--data-dir", str(tmp_path / "data"), "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = {r["engine"]: r for r in json.loads(out.read_text())}
    again = {e: rows.pop(e) for e in list(rows) if "@" in e}
    assert set(rows) == set(bm.MODELS)
    for engine, r in again.items():  # dl1 timed at the closest peer's looser gap
        assert engine.split("@")[0] in bm.REFERENCE.values() and r["gap"] <= r["asked_gap"], r
    for engine, r in rows.items():
        assert "error" not in r, r
        assert math.isfinite(r["gap"]) and 0 <= r["gap"] <= 1e-5, r
        assert r["peak_mb"] > 0 and r["fit_s"] > 0 and 0.5 < r["accuracy"] <= 1, r
        if engine.startswith("dl1"):
            assert r["gap"] <= 1e-6 and r["gap"] == pytest.approx(r["dl1_gap"], abs=1e-8), r
            assert r["vs_peer"].split(" x ")[-1] in bm.MODELS, r
    # Spark's answers certify ever tighter with its tol: the mapping of regParam is right
    spark = [t["gap"] for t in rows["spark"]["tries"]]
    assert spark[-1] < spark[0] / 10 or spark[0] <= 1e-6, spark
    assert "| tiny | amax/20" in proc.stdout and "| spark |" in proc.stdout


def _row(engine, gap, fit_s, model="multinomial"):
    return {"problem": "p", "alpha": 0.1, "model": model, "engine": engine, "gap": gap,
            "fit_s": fit_s}  # fmt: skip


def test_equal_gap_rows_time_dl1_at_the_closest_peers_gap():
    rows = [_row("dl1", 1e-8, 4.0), _row("saga", 2e-2, 1.0), _row("spark", 2e-5, 80.0),
            _row("dl1-ovr", 1e-7, 2.0, "ovr logistic"),
            _row("liblinear-ovr", 5e-8, 3.0, "ovr logistic")]  # fmt: skip
    # spark is the closest looser peer; liblinear reached dl1-ovr's gap: nothing to redo
    assert [r["engine"] for r in bm.closest_peers(rows)] == ["spark"]
    rows.append(_row("dl1@spark", 1.5e-5, 8.0) | {"asked_gap": 2e-5})
    bm.add_ratios(rows, tol=1e-6)
    assert rows[0]["vs_peer"] == "no peer at its gap"
    assert rows[-1]["vs_peer"] == "0.10 x spark"  # 8 s against spark's 80 s at 2e-5
    assert rows[3]["vs_peer"] == "0.67 x liblinear-ovr"
