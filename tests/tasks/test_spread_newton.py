"""The share task of a spread Newton step (dl1.tasks.spread_newton) against NumPy: its
step descends the share's quadratic model, ``u`` is ``X_share d``, and its gap statistics
are those of ``X^T theta`` on the live columns."""

import numpy as np
import scipy.sparse as sp

from dl1.objective.datafits import Logistic
from dl1.objective.penalties import ElasticNet
from dl1.tasks.blocks import assemble_block
from dl1.tasks.columns import extract_task
from dl1.tasks.spread_newton import newton_share_task


def _share(seed=0, n=300, p=40):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.2, random_state=seed, format="csc") * 3.0
    y = np.where(rng.standard_normal(n) > 0, 1.0, -1.0)
    return X, y, rng


def test_a_share_step_descends_its_model_and_reports_x_d_and_the_gap_stats():
    X, y, rng = _share()
    n, p = X.shape
    block = assemble_block(0, 0, np.zeros(0), False, True, X)
    ids = [np.arange(0, 25), np.arange(25, 40)]
    groups = [extract_task(block, i) for i in ids]
    keeps = [np.array([0, 3, 4, 10, 20]), np.arange(15)]
    live = np.concatenate([i[k] for i, k in zip(ids, keeps, strict=True)])
    w = np.zeros(live.shape[0])
    w[:3] = rng.standard_normal(3)
    z = X[:, live] @ w
    g, h = np.empty(n), np.empty(n)
    Logistic().grad_hess(y, z, np.zeros(0), g, h)
    theta = -g  # the dual point's scale: thresholds are n alpha_l1
    pen = ElasticNet(0.01, 0.9)
    out = newton_share_task(groups, ids, keeps, w, g, h, theta, n * pen.alpha_l1, pen, 0.25, 25,
                            False)  # fmt: skip
    Xl = X[:, live].toarray()
    np.testing.assert_allclose(out.u, Xl @ out.dw, rtol=1e-12, atol=1e-12)
    c = np.abs(Xl.T @ theta)
    assert np.isclose(out.stats.absmax, c.max(), rtol=1e-12)
    excess = np.maximum(c - n * pen.alpha_l1, 0.0)
    np.testing.assert_allclose(out.stats.excess, excess @ excess, rtol=1e-10, atol=1e-15)

    def model(d):
        v = Xl @ d
        return (g @ v + v @ (h * v) / 2) / n + pen.value(w + d)

    assert out.epochs >= 1 and np.any(out.dw != 0)
    assert model(out.dw) < model(np.zeros_like(w)) - 1e-8
    # the model's minimiser, by a dense proximal gradient
    d = np.zeros_like(w)
    H = Xl.T @ (h[:, None] * Xl) / n
    step = 1.0 / np.linalg.eigvalsh(H).max()
    for _ in range(20000):
        grad = Xl.T @ g / n + H @ d
        v = w + d - step * grad
        v = np.sign(v) * np.maximum(np.abs(v) - step * pen.alpha_l1, 0.0)
        v /= 1.0 + step * pen.alpha_l2
        d = v - w
    # inexact Newton: stopped once the remaining decrease is estimated at most INNER_RTOL
    # (1e-3) of the decrease so far; 2 x that, for the estimate
    best, start = model(d), model(np.zeros_like(w))
    assert model(out.dw) - best <= 2e-3 * (start - best)


def test_no_epochs_give_the_statistics_only():
    X, y, _ = _share(1)
    n = X.shape[0]
    block = assemble_block(0, 0, np.zeros(0), False, True, X)
    ids = [np.arange(40)]
    g, h = np.empty(n), np.empty(n)
    Logistic().grad_hess(y, np.zeros(n), np.zeros(0), g, h)
    pen = ElasticNet(0.01)
    out = newton_share_task([extract_task(block, ids[0])], ids, [np.arange(40)], np.zeros(40),
                            g, h, -g, n * pen.alpha_l1, pen, 0.25, 0, True)  # fmt: skip
    assert out.epochs == 0 and not out.dw.any() and not out.u.any()
    assert np.isclose(out.stats.absmax, np.abs(X.T @ g).max())


def _model_with_intercept(Xl, g, h, w, pen):
    """The model at a step ``d`` with its optimal intercept step."""

    def model(d):
        v = Xl @ d
        v = v - (g.sum() + h @ v) / h.sum()
        return (g @ v + v @ (h * v) / 2) / Xl.shape[0] + pen.value(w + d)

    return model


def _dense_model_minimum(Xl, g, h, w, pen, intercept):
    """The model's minimum over ``d`` (and an unpenalised intercept step), by a dense
    proximal gradient on the model with the intercept step profiled out."""
    n = Xl.shape[0]
    if intercept:  # v = X d + e with e optimal: X replaced by its h-weighted centring
        mean = (h @ Xl) / h.sum()
        Xc, gc = Xl - mean, g - h * (g.sum() / h.sum())
        const = -(g.sum() ** 2) / (2 * h.sum()) / n
    else:
        Xc, gc, const = Xl, g, 0.0
    H = Xc.T @ (h[:, None] * Xc) / n
    step = 1.0 / np.linalg.eigvalsh(H).max()
    d = np.zeros_like(w)
    for _ in range(20000):
        v = w + d - step * (Xc.T @ gc / n + H @ d)
        v = np.sign(v) * np.maximum(np.abs(v) - step * pen.alpha_l1, 0.0)
        d = v / (1.0 + step * pen.alpha_l2) - w
    v = Xc @ d
    return (gc @ v + v @ (h * v) / 2) / n + const + pen.value(w + d)


def test_a_share_step_with_an_intercept_descends_the_model_with_its_intercept_step():
    """With ``intercept`` the share's model has a free intercept step (profiled out, as
    in the gathered mode): the step is near the model's minimum over both, which is
    lower than the minimum without it on columns of one sign."""
    X, y, rng = _share(2)
    X = abs(X)  # text: every column of one sign, the intercept's direction among them
    n = X.shape[0]
    block = assemble_block(0, 0, np.zeros(0), False, True, X)
    ids = [np.arange(40)]
    w = np.zeros(40)
    g, h = np.empty(n), np.empty(n)
    Logistic().grad_hess(y, np.full(n, 0.4), np.zeros(0), g, h)  # intercept not optimal
    pen = ElasticNet(0.005)
    Xl = X.toarray()
    model = _model_with_intercept(Xl, g, h, w, pen)
    out = newton_share_task([extract_task(block, ids[0])], ids, [np.arange(40)], w, g, h,
                            -g, n * pen.alpha_l1, pen, 0.25, 25, True)  # fmt: skip
    best = _dense_model_minimum(Xl, g, h, w, pen, True)
    assert model(out.dw) - best <= 2e-3 * (model(np.zeros(40)) - best)
    assert best < _dense_model_minimum(Xl, g, h, w, pen, False) - 1e-6


def test_a_share_after_another_minimises_the_model_given_its_step():
    """``before``: the share's gradient is ``g + h X d_before`` and its ``u`` adds its
    ``X d`` to the previous one's, so the last share carries the step's ``X d``."""
    X, y, _ = _share(3)
    n = X.shape[0]
    block = assemble_block(0, 0, np.zeros(0), False, True, X)
    first, second = [np.arange(20)], [np.arange(20, 40)]
    g, h = np.empty(n), np.empty(n)
    Logistic().grad_hess(y, np.zeros(n), np.zeros(0), g, h)
    pen = ElasticNet(0.01)
    args = (-g, n * pen.alpha_l1, pen, 0.25, 25, True)
    a = newton_share_task([extract_task(block, first[0])], first, [np.arange(20)],
                          np.zeros(20), g, h, *args)  # fmt: skip
    b = newton_share_task([extract_task(block, second[0])], second, [np.arange(20)],
                          np.zeros(20), g, h, *args, a)  # fmt: skip
    alone = newton_share_task([extract_task(block, second[0])], second, [np.arange(20)],
                              np.zeros(20), g + h * a.u, h, *args)  # fmt: skip
    assert np.any(a.dw != 0) and np.any(b.dw != 0)
    np.testing.assert_array_equal(b.dw, alone.dw)
    Xd = X.toarray()
    np.testing.assert_allclose(b.u, Xd[:, :20] @ a.dw + Xd[:, 20:] @ b.dw, rtol=1e-12,
                               atol=1e-12)  # fmt: skip


def test_sweeps_of_visits_approach_the_joint_model_minimum():
    """Two shares of correlated columns visiting in turn, a few epochs a visit: the joined
    step after several sweeps is nearer the model's joint minimum than one long visit
    each; ``own`` carries a share's step and statistics from sweep to sweep."""
    X, y, _ = _share(4)
    X = abs(X) + sp.random(300, 40, density=0.3, random_state=5)  # correlated, one sign
    X = sp.csc_matrix(X)
    n = X.shape[0]
    block = assemble_block(0, 0, np.zeros(0), False, True, X)
    halves = [np.arange(20), np.arange(20, 40)]
    groups = [extract_task(block, i) for i in halves]
    g, h = np.empty(n), np.empty(n)
    Logistic().grad_hess(y, np.zeros(n), np.zeros(0), g, h)
    pen = ElasticNet(0.002)
    Xd = X.toarray()
    model = _model_with_intercept(Xd, g, h, np.zeros(40), pen)

    def run(sweeps, epochs):
        last, before = [None, None], None
        for _ in range(sweeps):
            for i in range(2):
                last[i] = before = newton_share_task(
                    [groups[i]], [halves[i]], [np.arange(20)], np.zeros(20), g, h, -g,
                    n * pen.alpha_l1, pen, 0.25, epochs, True, before, last[i],
                )  # fmt: skip
        return last

    first = run(1, 25)
    swept = run(8, 3)
    d = np.concatenate([swept[0].dw, swept[1].dw])
    np.testing.assert_allclose(swept[1].u, Xd @ d, rtol=1e-10, atol=1e-12)
    assert swept[0].stats == first[0].stats  # computed in the first sweep only
    # a later visit carries its share's statistics, whatever theta it is given
    again = newton_share_task([groups[0]], [halves[0]], [np.arange(20)], np.zeros(20), g, h,
                              -2.0 * g, n * pen.alpha_l1, pen, 0.25, 3, True, swept[1],
                              swept[0])  # fmt: skip
    assert again.stats is swept[0].stats
    best = _dense_model_minimum(Xd, g, h, np.zeros(40), pen, True)
    one = model(np.concatenate([first[0].dw, first[1].dw]))
    assert model(d) - best < 0.5 * (one - best)
