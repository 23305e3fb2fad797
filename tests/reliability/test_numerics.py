"""Numerical safety: values whose squares overflow or underflow are refused by name, data
of any representable scale gets the right answer, and a non-finite number met during a
solve stops it with NumericalError instead of running to its limits.

Cases that hung before the fixes run in a subprocess with a timeout (:func:`isolated`), so
a regression fails the test instead of hanging the suite.
"""

import json
import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import dl1
from dl1.errors import NumericalError, ValidationError

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


CATCH = """
def outcome(fn):
    import time
    t0 = time.perf_counter()
    try:
        fn()
        return {"error": None, "seconds": time.perf_counter() - t0}
    except Exception as e:
        return {"error": type(e).__name__, "message": str(e),
                "seconds": time.perf_counter() - t0}
"""


def isolated(body: str, timeout: float = 120.0) -> dict:
    """Run ``body`` (Python filling ``out``, a JSON-able dict; :data:`CATCH`'s ``outcome``
    is defined) in a fresh interpreter with a timeout; returns ``out``. A hang or a crash
    fails the calling test."""
    script = "import json, warnings\nwarnings.simplefilter('ignore')\nout = {}\n"
    script += CATCH + textwrap.dedent(body) + "\nprint('@@' + json.dumps(out))\n"
    proc = subprocess.run(
        [sys.executable, "-c", script], env=ENV, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@")][-1]
    return json.loads(line[2:])


def problem(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((50, 20))
    return X, X[:, 0] - 2 * X[:, 1] + 0.1 * rng.standard_normal(50)




@pytest.mark.slow
def test_a_value_whose_square_overflows_is_refused_naming_its_column(tmp_path):
    """Pass criterion: X[0, c] = 1e200 in a 50 x 20 matrix (dense, sparse, dask, store) and
    y[0] = 1e200 each raise ValidationError naming the column (its global index) or y and
    'overflows', within seconds (before: the Gram epochs overflowed to NaN and the fit did
    not return in 120 s; with max_rounds=50 it returned NaN after ~40 s)."""
    out = isolated(
        f"""
        import numpy as np, scipy.sparse as sp, dask.array as da, dl1
        rng = np.random.default_rng(0)
        X = rng.standard_normal((50, 20)); y = X[:, 0] + 0.1 * rng.standard_normal(50)
        Xh = X.copy(); Xh[0, 13] = 1e200
        dl1.from_scipy(sp.csr_matrix(Xh), y, {str(tmp_path / "s")!r}, n_feature_blocks=3)
        yh = y.copy(); yh[4] = 1e200
        out["dense"] = outcome(lambda: dl1.fit(Xh, y, alpha=0.1))
        out["sparse"] = outcome(lambda: dl1.fit(sp.csr_matrix(Xh), y, alpha=0.1))
        out["dask"] = outcome(lambda: dl1.fit(da.from_array(Xh, chunks=(25, 7)), y, alpha=0.1))
        out["store"] = outcome(lambda: dl1.fit({str(tmp_path / "s")!r}, alpha=0.1))
        out["path"] = outcome(lambda: dl1.path(Xh, y, n_alphas=3))
        out["y"] = outcome(lambda: dl1.fit(X, yh, alpha=0.1))
        """
    )
    for case in ("dense", "sparse", "dask", "store", "path"):
        assert out[case]["error"] == "ValidationError", (case, out[case])
        assert "column 13" in out[case]["message"], out[case]
        assert "overflows float64" in out[case]["message"]
        assert out[case]["seconds"] < 30
    assert out["y"]["error"] == "ValidationError"
    assert out["y"]["message"].startswith("y: its sum of squares overflows")
    assert "y[4] = 1e+200" in out["y"]["message"]


def test_squares_that_underflow_are_refused_naming_the_column(tmp_path):
    """Pass criterion: X scaled by 1e-300 (in memory and from a store, with or without
    standardize) raises ValidationError naming a column and 'underflows' (before: 'converged'
    at w = 0; with standardize the scale-free answer is not w = 0), and so does y * 1e-300."""
    X, y = problem()
    tiny = X * 1e-300
    for kw in ({}, {"standardize": True}):
        with pytest.raises(ValidationError, match=r"column \d+: its sum of squares underflows"):
            dl1.fit(tiny, y, alpha=1e-301, **kw)
    dl1.from_scipy(sp.csr_matrix(tiny), y, tmp_path / "s", n_feature_blocks=2)
    with pytest.raises(ValidationError, match=r"feature block \d, column \d+: .* underflows"):
        dl1.fit(tmp_path / "s", alpha=1e-301)
    with pytest.raises(ValidationError, match=r"^y: its sum of squares underflows"):
        dl1.fit(X, y * 1e-300, alpha=0.1)


@pytest.mark.slow
def test_data_of_any_representable_scale_gets_the_right_answer():
    """Pass criterion: for X scaled by c in {1e-30, 1e-100, 1e20, 1e150} and alpha scaled by
    c, c * coef_ equals scikit-learn's Lasso on the unscaled data (the Lasso's solution
    scales as 1/c) to 1e-6, certified; standardize=True at c = 1e-100 equals the unscaled
    standardized fit (before: c = 1e-30 and 1e20 did not return within 60 s, their float32
    Gram matrix underflowing or overflowing)."""
    from sklearn.linear_model import Lasso

    X, y = problem()
    want = Lasso(alpha=0.1, tol=1e-12, max_iter=100_000).fit(X, y).coef_
    out = isolated(
        """
        import numpy as np, dl1
        rng = np.random.default_rng(0)
        X = rng.standard_normal((50, 20))
        y = X[:, 0] - 2 * X[:, 1] + 0.1 * rng.standard_normal(50)
        for c in (1e-30, 1e-100, 1e20, 1e150):
            r = dl1.fit(X * c, y, alpha=0.1 * c, tol=1e-10, max_rounds=50)
            out[repr(c)] = [r.converged_, (r.coef_ * c).tolist()]
        ref = dl1.fit(X, y, alpha=0.1, tol=1e-10, standardize=True)
        r = dl1.fit(X * 1e-100, y, alpha=0.1, tol=1e-10, standardize=True, max_rounds=50)
        out["std"] = [r.converged_, (r.coef_ * 1e-100).tolist(), ref.coef_.tolist()]
        """,
        timeout=240,
    )
    for c in ("1e-30", "1e-100", "1e+20", "1e+150"):
        converged, coef = out[c]
        assert converged, c
        np.testing.assert_allclose(coef, want, atol=1e-6, err_msg=c)
    converged, coef, ref = out["std"]
    assert converged
    np.testing.assert_allclose(coef, ref, rtol=1e-6, atol=1e-9)


def _overflowing(task):
    """``task`` whose returned update (``dz`` / ``u``) has overflowed to infinity in its
    first entry."""

    def wrapped(*args):
        out = task(*args)
        field = "dz" if hasattr(out, "dz") else "u"
        update = getattr(out, field).copy()
        update[0] = np.inf
        return out._replace(**{field: update})

    return wrapped


def test_an_overflow_inside_a_working_set_solve_stops_it(monkeypatch):
    """Pass criterion: when a subproblem's update overflows (injected: its change of X w is
    infinite) the working-set solver raises NumericalError naming round 0 and the
    subproblem's update, at once (not after max_rounds x 50,000 epochs)."""
    import dl1.solvers.ws as ws

    monkeypatch.setattr(ws, "subproblem_task", _overflowing(ws.subproblem_task))
    X, y = problem()
    t0 = time.perf_counter()
    with pytest.raises(NumericalError, match=r"working-set solver, round 0: the update of the "
                       r"subproblem on \d+ features is not finite"):  # fmt: skip
        dl1.fit(X, y, alpha=0.01)
    assert time.perf_counter() - t0 < 30


def test_an_overflow_inside_coordinate_descent_names_round_and_block(monkeypatch):
    """Pass criterion: when a partition's update overflows (injected) coordinate descent
    raises NumericalError at the next round naming round 1, the quantity (the duality gap)
    and the values it came from (the intercept, -inf)."""
    import dl1.solvers.cd as cd

    monkeypatch.setattr(cd, "round_task", _overflowing(cd.round_task))
    X, y = problem()
    with (
        warnings.catch_warnings(),  # numpy's own "invalid value" warnings on the way
        pytest.raises(NumericalError, match=r"coordinate descent, round 1: the duality gap "
                      r"is not finite \(duality gap nan, .*intercept -inf\)"),
    ):  # fmt: skip
        warnings.simplefilter("ignore", RuntimeWarning)
        dl1.fit(X, y, alpha=0.01, solver="cd")


def test_a_subproblem_stops_its_epochs_at_a_non_finite_gap():
    """Pass criterion: a gathered subproblem started from a point whose residual is NaN
    returns after its first gap check (0 epochs, both the Gram and the column modes) instead
    of running its 50,000 epochs."""
    from dl1.objective.datafits import Quadratic
    from dl1.objective.penalties.elastic_net import ElasticNet
    from dl1.tasks.blocks import assemble_block
    from dl1.tasks.columns import extract_task
    from dl1.tasks.subproblem import SubproblemSettings, subproblem_task

    X, y = problem()
    ws = np.arange(5)
    group = extract_task(assemble_block(0, 0, np.zeros(0), False, True, X[:, :5]), ws)
    z = np.full(50, np.nan)
    for gram_max in (4096, 0):
        settings = SubproblemSettings(Quadratic(), ElasticNet(0.01), True, 1e-9, 50_000,
                                      gram_max=gram_max)  # fmt: skip
        out = subproblem_task([group], [ws], [True], ws, np.zeros(5), y, z, np.zeros(0),
                              settings)  # fmt: skip
        assert out.info.epochs == 0, gram_max
        assert not np.isfinite(out.info.gap)


def test_the_first_block_with_non_finite_statistics_is_named():
    """Pass criterion: the round check names the quantity, the round, the solver and the
    first feature block whose statistics are infinite; finite values pass."""
    from dl1.solvers.numerics import check_round
    from dl1.tasks.records import GapStats

    stats = [GapStats(1.0, 2.0), GapStats(np.inf, 0.0), GapStats(np.nan, 0.0)]
    check_round("ws", 3, {"duality gap": 1.0, "objective": 2.0}, stats[:1])
    with pytest.raises(NumericalError, match=r"^ws, round 3: the objective is not finite "
                       r"\(first in feature block 1: max \|x_j\^T theta\| inf\)"):  # fmt: skip
        check_round("ws", 3, {"duality gap": 1.0, "objective": np.inf}, stats)


@pytest.mark.slow
def test_fuzzed_scales_give_the_right_answer_or_a_named_refusal():
    """Pass criterion: over 40 random problems whose columns are scaled by 10^u (u uniform in
    [-170, 170], or [-150, 150] for every other problem) and y by 10^v (v in [-165, 165],
    or [-150, 150]), each standardized fit at alpha * 10^v
    either raises ValidationError naming a column whose sum of squares leaves float64 (or
    y), exactly when one does, or is certified and equals the unscaled fit (coefficients
    rescaled) to 1e-6; the whole run ends within its 15-minute timeout (no hang)."""
    out = isolated(
        """
        import math
        import numpy as np, dl1
        from dl1.errors import ValidationError
        rng = np.random.default_rng(2024)
        out["cases"] = []
        for case in range(40):
            n, p = 60, 15
            X = rng.standard_normal((n, p))
            y = X[:, :3] @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.standard_normal(n)
            wide = case % 2 == 0
            u = rng.uniform(-170, 170, size=p) if wide else rng.uniform(-150, 150, size=p)
            v = float(rng.uniform(-165, 165) if wide else rng.uniform(-150, 150))
            ref = dl1.fit(X, y, alpha=0.05, standardize=True, tol=1e-10)
            # the sums of squares in log10: out of float64's normal range means a refusal
            logsq_x = 2 * u + np.log10((X**2).sum(axis=0))
            logsq_y = 2 * v + math.log10(float(y @ y))
            lo, hi = math.log10(np.finfo(float).tiny), math.log10(np.finfo(float).max)
            bad_cols = np.flatnonzero((logsq_x < lo + 0.5) | (logsq_x > hi - 0.5))
            edge = np.any(np.abs(logsq_x - lo) < 0.5) or np.any(np.abs(logsq_x - hi) < 0.5)
            bad_y = not (lo + 0.5 < logsq_y < hi - 0.5)
            edge_y = abs(logsq_y - lo) < 0.5 or abs(logsq_y - hi) < 0.5
            rec = {"case": case, "bad_cols": bad_cols.tolist(), "bad_y": bad_y,
                   "edge": bool(edge or edge_y)}
            try:
                r = dl1.fit(X * 10.0**u, y * 10.0**v, alpha=0.05 * 10.0**v,
                            standardize=True, tol=1e-10, max_rounds=200)
                coef = r.coef_ * 10.0**u / 10.0**v
                rec.update(error=None, converged=bool(r.converged_),
                           err=float(np.abs(coef - ref.coef_).max()))
            except ValidationError as e:
                rec.update(error="ValidationError", message=str(e))
            out["cases"].append(rec)
        """,
        timeout=300,
    )
    refused = 0
    for rec in out["cases"]:
        if rec["edge"]:  # within half a decade of the limit: either outcome is right
            continue
        if rec["bad_y"] or rec["bad_cols"]:
            refused += 1
            assert rec["error"] == "ValidationError", rec
            if rec["bad_y"] and not rec["bad_cols"]:
                assert rec["message"].startswith("y: its sum of squares"), rec
            elif not rec["bad_y"]:
                named = int(rec["message"].split("column ")[1].split(":")[0].split(" ")[0])
                assert named in rec["bad_cols"], rec
        else:
            assert rec["error"] is None and rec["converged"], rec
            assert rec["err"] < 1e-6, rec
    solved = sum(rec["error"] is None for rec in out["cases"])
    assert refused >= 5 and solved >= 15, (refused, solved)
