"""The proximal Newton model's kernels against NumPy transcriptions."""

from __future__ import annotations

import numpy as np
import pytest

from dl1.kernels.cd import weighted_cd_epochs, weighted_col_stats
from tests.kernel_helpers import DTYPES, EMPTY, NO_BOX, arrays, make_csc, maybe_scale, scaled_dense


def fresh() -> np.ndarray:
    """The stopping rule's state for a new model."""
    return np.array([np.inf, 0.0, 0.0])


def reference_epochs(dense, w, g, h, floor, n, a1, a2, e, h_sum, n_epochs, order=None,
                     extra=None, reach=None):  # fmt: skip
    """Cyclic coordinate descent on ``(g^T v + v^T H v / 2 + sum_j E_j d_j^2 / 2) / n +
    pen(w + d)``, ``v = X d + e`` (``E``: ``extra``, zero by default), the intercept step
    ``e`` profiled out when ``h_sum > 0``, over the columns ``order`` (all by default), each
    ``|d_j| <= reach_j`` (no box by default)."""
    d, u = np.zeros_like(w), np.zeros(dense.shape[0])
    extra = np.zeros_like(w) if extra is None else extra
    for _ in range(n_epochs):
        for j in range(w.shape[0]) if order is None else order:
            x = dense[:, j]
            lc = h @ (x * x)
            if h_sum > 0:
                centred = lc - (h @ x) ** 2 / h_sum
                lc = centred if centred > 1e-12 * lc else 0.0
            lc = max(lc, floor[j]) + extra[j]
            if lc <= 0:
                continue
            grad = (x @ (g + h * (u + e)) + extra[j] * d[j]) / n
            v = w[j] + d[j]
            t = lc / n * v - grad
            new = np.sign(t) * max(abs(t) - a1, 0.0) / (lc / n + a2)
            if reach is not None:  # the convex model's minimiser on the box's interval
                new = w[j] + np.clip(new - w[j], -reach[j], reach[j])
            u += x * (new - v)
            if h_sum > 0:
                e -= (new - v) * (h @ x) / h_sum
            d[j] += new - v
    return d, u, e


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hdtype", [np.float64, np.float32])
@pytest.mark.parametrize(("use_scale", "profile", "a2"), [(False, False, 0.0), (True, True, 0.0),
                                                          (False, True, 0.05), (True, False, 0.1)])
@pytest.mark.parametrize(("damped", "boxed"), [(False, False), (True, False), (False, True)])
def test_weighted_cd_epochs_match_reference(dtype, hdtype, use_scale, profile, a2, damped,
                                            boxed):  # fmt: skip
    n, p = 50, 12
    rng = np.random.default_rng(2)
    X = make_csc(n, p, 0.4, dtype, 7)
    scale = maybe_scale(p, use_scale, rng)
    dense = scaled_dense(X, scale)
    ip, ix, data = arrays(X)
    w = rng.normal(size=p) * (rng.random(p) < 0.5)
    g = rng.normal(size=n)
    h = rng.uniform(0.0, 0.25, n)
    h[:5] = 0.0
    lj, hx, hdata = np.empty(p), np.empty(p), np.empty(data.shape[0], dtype=hdtype)
    weighted_col_stats(ip, ix, data, scale, h, lj, hx, hdata)
    np.testing.assert_allclose(lj, h @ dense**2, rtol=1e-6 if dtype == np.float32 else 1e-12)
    np.testing.assert_allclose(hx, h @ dense, rtol=1e-6 if dtype == np.float32 else 1e-12)
    np.testing.assert_array_equal(hdata, (h[ix] * data.astype(np.float64)).astype(hdtype))
    floor = 1e-4 * (dense**2).sum(axis=0)
    damping = 0.3 * (dense**2).sum(axis=0) if damped else EMPTY
    reach = rng.uniform(0.0, 0.2, p) if boxed else EMPTY
    h_sum = float(h.sum()) if profile else 0.0
    e0 = -g.sum() / h_sum if profile else 0.0
    shift = np.array([e0, h_sum])
    dw, r = np.zeros(p), g.copy()
    epochs = weighted_cd_epochs(ip, ix, data, scale, w, dw, r, hdata, lj, hx, floor, damping,
                                reach, float(n), 0.02, a2, EMPTY, NO_BOX, shift, np.arange(p), 3,
                                0.0, fresh())  # fmt: skip
    # a box can stop every column: an epoch moving nothing ends the descent (a fixed point)
    assert epochs == 3 or (boxed and epochs < 3)
    d, u_ref, e = reference_epochs(dense, w, g, h, floor, n, 0.02, a2, e0, h_sum, 3,
                                   extra=damping if damped else None,
                                   reach=reach if boxed else None)  # fmt: skip
    if boxed:
        assert np.all(np.abs(dw) <= reach) and np.any(np.abs(dw) == reach)  # the box binds
    # float32 Hessian weights perturb the model by float32's rounding only
    tol = 1e-5 if np.float32 in (dtype, hdtype) else 1e-10
    np.testing.assert_allclose(dw, d, rtol=tol, atol=tol)
    np.testing.assert_allclose(r, g + h * u_ref, rtol=tol, atol=tol)
    assert shift[0] == pytest.approx(e, rel=tol, abs=tol)
    if profile:  # the model's intercept stays optimal
        assert abs(np.sum(r + h * shift[0])) <= 1e2 * tol * np.abs(g).sum()


@pytest.mark.parametrize("damped", [False, True])
def test_weighted_cd_epochs_stop_at_rtol_and_reach_the_model_minimum(damped):
    n, p = 60, 8
    rng = np.random.default_rng(3)
    X = make_csc(n, p, 0.5, np.float64, 1)
    dense = scaled_dense(X, EMPTY)
    ip, ix, data = arrays(X)
    g, h, w = rng.normal(size=n), rng.uniform(0.05, 0.25, n), np.zeros(p)
    lj, hx = np.empty(p), np.empty(p)
    weighted_col_stats(ip, ix, data, EMPTY, h, lj, hx, EMPTY)
    hdata = h[ix] * data
    floor = np.zeros(p)
    extra = 0.5 * lj if damped else EMPTY

    def run(rtol, max_epochs=10_000):
        dw, r = np.zeros(p), g.copy()
        k = weighted_cd_epochs(ip, ix, data, EMPTY, w, dw, r, hdata, lj, hx, floor, extra,
                               EMPTY, float(n), 0.0, 0.0, EMPTY, NO_BOX, np.zeros(2), np.arange(p),
                               max_epochs, rtol, fresh())  # fmt: skip
        return k, dw

    k_loose, _ = run(1e-1)
    k_tight, dw = run(1e-12)
    assert 2 <= k_loose < k_tight < 10_000
    # without a penalty the model's minimiser solves (X^T H X + diag(E)) d = -X^T g
    H = dense.T @ (h[:, None] * dense) + (np.diag(extra) if damped else 0.0)
    keep = np.diag(H) > 0
    d_ref = np.linalg.lstsq(H[np.ix_(keep, keep)], -(dense.T @ g)[keep], rcond=None)[0]
    np.testing.assert_allclose(dw[keep], d_ref, rtol=1e-5, atol=1e-7)


def test_epochs_one_at_a_time_carry_the_stopping_rule():
    """Pass: calls of one epoch each, carrying ``progress``, end where one call of many
    ends: the same epochs run, the same step ``dw``, ``r`` and intercept step, and the rule's
    stop flagged."""
    n, p = 60, 8
    rng = np.random.default_rng(5)
    X = make_csc(n, p, 0.5, np.float64, 2)
    ip, ix, data = arrays(X)
    g, h, w = rng.normal(size=n), rng.uniform(0.05, 0.25, n), rng.normal(size=p)
    lj, hx = np.empty(p), np.empty(p)
    weighted_col_stats(ip, ix, data, EMPTY, h, lj, hx, EMPTY)
    hdata, floor = h[ix] * data, np.zeros(p)
    shift0 = np.array([-g.sum() / h.sum(), h.sum()])

    def state():
        return np.zeros(p), g.copy(), shift0.copy(), fresh()

    def call(dw, r, shift, progress, max_epochs):
        return weighted_cd_epochs(
            ip, ix, data, EMPTY, w, dw, r, hdata, lj, hx, floor, EMPTY, EMPTY, float(n), 0.01,
            0.0, EMPTY, NO_BOX, shift, np.arange(p), max_epochs, 1e-6, progress,
        )  # fmt: skip

    dw, r, shift, progress = state()
    k = call(dw, r, shift, progress, 10_000)
    assert 2 <= k < 10_000 and progress[2] == 1.0
    dw1, r1, shift1, progress1 = state()
    k1 = 0
    while progress1[2] == 0.0 and k1 < 10_000:
        k1 += call(dw1, r1, shift1, progress1, 1)
    assert k1 == k
    np.testing.assert_array_equal(dw1, dw)
    np.testing.assert_array_equal(r1, r)
    np.testing.assert_array_equal(shift1, shift)


def test_weighted_cd_epochs_visit_only_the_columns_in_order():
    """Pass: epochs over a subset of the columns, in a given order, match the reference
    over that order; the other columns' steps stay zero."""
    n, p = 50, 12
    rng = np.random.default_rng(8)
    X = make_csc(n, p, 0.4, np.float64, 3)
    dense = scaled_dense(X, EMPTY)
    ip, ix, data = arrays(X)
    w = rng.normal(size=p) * (rng.random(p) < 0.5)
    g, h = rng.normal(size=n), rng.uniform(0.05, 0.25, n)
    lj, hx, hdata = np.empty(p), np.empty(p), np.empty(data.shape[0])
    weighted_col_stats(ip, ix, data, EMPTY, h, lj, hx, hdata)
    floor = np.zeros(p)
    order = np.array([7, 2, 9, 0], dtype=np.int64)
    shift = np.array([-g.sum() / h.sum(), h.sum()])
    e0 = float(shift[0])
    dw, r = np.zeros(p), g.copy()
    weighted_cd_epochs(ip, ix, data, EMPTY, w, dw, r, hdata, lj, hx, floor, EMPTY, EMPTY, float(n),
                       0.01, 0.0, EMPTY, NO_BOX, shift, order, 4, 0.0, fresh())  # fmt: skip
    d, u_ref, e = reference_epochs(dense, w, g, h, floor, n, 0.01, 0.0, e0, float(h.sum()), 4,
                                   order)  # fmt: skip
    np.testing.assert_allclose(dw, d, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(r, g + h * u_ref, rtol=1e-10, atol=1e-12)
    assert shift[0] == pytest.approx(e, rel=1e-10, abs=1e-12)
    assert not dw[np.setdiff1d(np.arange(p), order)].any()


def test_an_epoch_after_one_that_moved_nothing_goes_on():
    """Pass: after an epoch that moved nothing (an active set's last, ``progress[0] = 0``),
    an epoch that moves columns is no division by zero and does not stop the rule."""
    n, p = 40, 6
    rng = np.random.default_rng(9)
    X = make_csc(n, p, 0.5, np.float64, 4)
    ip, ix, data = arrays(X)
    g, h = rng.normal(size=n), rng.uniform(0.05, 0.25, n)
    lj, hx = np.empty(p), np.empty(p)
    weighted_col_stats(ip, ix, data, EMPTY, h, lj, hx, EMPTY)
    dw, r, progress = np.zeros(p), g.copy(), np.array([0.0, 1.0, 0.0])
    k = weighted_cd_epochs(ip, ix, data, EMPTY, np.zeros(p), dw, r, h[ix] * data, lj, hx,
                           np.zeros(p), EMPTY, EMPTY, float(n), 0.0, 0.0, EMPTY, NO_BOX,
                           np.zeros(2),
                           np.arange(p), 1, 1e-3,
                           progress)  # fmt: skip
    assert k == 1 and dw.any() and progress[2] == 0.0
