"""Worker-side tasks: the gathered subproblem, column compaction, cached and spread Gram
matrices and the Gram gap estimate, against scikit-learn and NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import ElasticNet as SkElasticNet

from dl1.objective.datafits import Quadratic
from dl1.objective.penalties import ElasticNet
from tests.kernel_helpers import EMPTY, make_csc


def test_sparse_subproblem_with_intercept_matches_sklearn():
    """The working-set subproblem without a Gram matrix (profiled intercept) on positive
    features converges to scikit-learn's Lasso with intercept."""
    from dl1.tasks.blocks import assemble_block
    from dl1.tasks.columns import extract_task
    from dl1.tasks.subproblem import SubproblemSettings, subproblem_task

    rng = np.random.default_rng(2)
    n, p = 80, 30
    dense = np.abs(rng.standard_normal((n, p))) * (rng.random((n, p)) < 0.4) + 0.5 * (
        rng.random((n, p)) < 0.5
    )
    y = dense[:, :5] @ rng.standard_normal(5) + 0.1 * rng.standard_normal(n) + 3.0
    alpha = 0.01 * np.abs(dense.T @ (y - y.mean())).max() / n
    blk = assemble_block(0, 0, np.zeros(0), False, True, sp.csc_matrix(dense))
    ids = np.arange(p, dtype=np.int64)
    ext = extract_task(blk, ids)
    z = np.full(n, y.mean())
    res = subproblem_task(
        [ext],
        [ids],
        [True],
        ids,
        np.zeros(p),
        y,
        z,
        EMPTY,
        SubproblemSettings(Quadratic(), ElasticNet(alpha), True, 1e-12, 100_000, gram_max=0),
    )
    w, dz = res.w_ws, res.dz
    sk = SkElasticNet(alpha=alpha, l1_ratio=1.0, tol=1e-14, max_iter=1_000_000).fit(dense, y)
    np.testing.assert_allclose(w, sk.coef_, atol=1e-6)
    np.testing.assert_allclose(z + dz, dense @ sk.coef_ + sk.intercept_, atol=1e-6)


@pytest.mark.parametrize("use_scale", [False, True])
def test_compact_task_equals_extracting_the_subset(use_scale):
    from dl1.tasks.blocks import assemble_block
    from dl1.tasks.columns import compact_task, extract_task

    rng = np.random.default_rng(4)
    X = make_csc(20, 15, 0.4, np.float32, 1)
    blk = assemble_block(0, 0, np.zeros(0), use_scale, True, X)
    cols = np.array([1, 3, 4, 8, 9, 14])
    keep = np.sort(rng.choice(cols.shape[0], 3, replace=False))
    got = compact_task(extract_task(blk, cols), keep)
    want = extract_task(blk, cols[keep])
    for a, b in zip(got[:6], want[:6], strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("density", [0.02, 0.6])  # the sparse product and the BLAS branch
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("profiled", [False, True])  # factor * G - c c^T (the subproblem's Q)
def test_working_set_gram_cached_equals_numpy(density, weighted, profiled):
    from dl1.tasks.gram import GRAM_CACHE, GRAM_DTYPE, working_set_gram

    rng = np.random.default_rng(int(density * 100) + weighted)
    n, p = 60, 40
    X = sp.random(n, p, density=density, format="csc", random_state=rng)
    X.sort_indices()
    s = rng.uniform(0.5, 2.0, n) if weighted else np.zeros(0)
    full = X.T @ (X.multiply(s[:, None]) if weighted else X)
    full = np.asarray(full.todense())
    factor, c_all = 1.0, None
    if profiled:
        factor, c_all = 1.0 / n, rng.standard_normal(p)
        full = factor * full - np.outer(c_all, c_all)
    key = f"test-{density}-{weighted}-{profiled}"
    GRAM_CACHE.pop(key, None)

    def gram(ws, scratch_max=10**6):
        A = X[:, ws]
        ip, ix, v = A.indptr.astype(np.int64), A.indices, A.data
        c = None if c_all is None else c_all[ws]
        return working_set_gram(ip, ix, v, n, s, ws, key, scratch_max, factor, c)

    # a first working set, then one that drops some columns and adds others: the rows of
    # the kept columns come from the cache, the new ones are computed (row blocks of 7)
    ws1 = np.sort(rng.choice(p, 15, replace=False))
    G1 = gram(ws1)
    # formed in float64, stored as GRAM_DTYPE: each entry is the float64 one, rounded
    assert G1.dtype == GRAM_DTYPE
    want = full[np.ix_(ws1, ws1)].astype(GRAM_DTYPE)
    np.testing.assert_allclose(G1, want, rtol=2.0**-23, atol=1e-12)  # one float32 ulp
    ws2 = np.union1d(ws1[::2], np.sort(rng.choice(p, 12, replace=False)))
    G2 = gram(ws2, scratch_max=7 * ws2.shape[0])
    want = full[np.ix_(ws2, ws2)].astype(GRAM_DTYPE)
    np.testing.assert_allclose(G2, want, rtol=2.0**-23, atol=1e-12)
    kept = np.isin(ws2, ws1)
    # cached entries are reused as they were
    sel1 = np.searchsorted(ws1, ws2[kept])
    np.testing.assert_array_equal(G2[np.ix_(kept, kept)], G1[np.ix_(sel1, sel1)])
    assert GRAM_CACHE[key][0].tolist() == ws2.tolist()
    assert gram(ws2) is G2  # the same working set again: the cached matrix, no work
    GRAM_CACHE.pop(key)


@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("l1_ratio", [1.0, 0.4])
def test_gram_gap_estimate_equals_the_exact_gap(fit_intercept, weighted, l1_ratio):
    """Moved from an exact check point with the true ``X^T theta``, the Gram-matrix estimate
    of the restricted gap is the gap dl1.objective.gap computes from the residual."""
    from dl1.objective.datafits import Quadratic
    from dl1.objective.gap import duality_gap
    from dl1.objective.penalties.elastic_net import ElasticNet
    from dl1.tasks.gram import GramGapEstimate

    rng = np.random.default_rng(int(fit_intercept) + 2 * int(weighted) + int(10 * l1_ratio))
    n, m = 80, 12
    X = rng.standard_normal((n, m))
    y = rng.standard_normal(n) + 2.0
    s = rng.uniform(0.5, 2.0, n) if weighted else None
    df, pen = Quadratic(), ElasticNet(0.05, l1_ratio)

    def state(w):
        z = X @ w
        if fit_intercept:
            z = z + df.intercept_update(y, z, s)
        theta = df.dual_point(y, z, s, fit_intercept)
        return z, theta, X.T @ theta

    w0 = rng.standard_normal(m) * (rng.random(m) < 0.5)
    z0, th0, h0 = state(w0)
    ybar = (y.mean() if s is None else s @ y / s.sum()) if fit_intercept else 0.0
    g_y = X.T @ ((y - ybar) * (1.0 if s is None else s))
    est = GramGapEstimate(df, pen, y, z0, th0, h0, w0, s, g_y)
    for step in (0.0, 1e-3, 0.3):
        w1 = w0 + step * rng.standard_normal(m) * (rng.random(m) < 0.7)
        z1, th1, h1 = state(w1)
        _, _, want = duality_gap(df, pen, y, z1, w1, h1, s=s, intercept=fit_intercept, theta=th1)
        assert want > 0
        assert est.gap(w1, h1 / n) == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("density", [0.05, 0.6])  # the sparse product and the BLAS branch
@pytest.mark.parametrize(("weighted", "shares"), [(False, False), (True, False), (True, True)])
def test_spread_gram_across_partitions_equals_numpy(density, weighted, shares):
    """The Gram matrix of a working set spread over two partitions (products of new columns
    sent in row pieces of 7 rows, scaled columns, weights, intercept profile), then updated
    for a second working set: equal to NumPy's, with the kept entries reused bit for bit.
    With ``shares`` every group is a share of its own (a one-byte share budget), so shares
    of the same partition exchange row pieces too."""
    from dl1.runtime.executor import LocalExecutor
    from dl1.solvers.subproblems import CachedGroup, spread_gram_task, spread_plan
    from dl1.tasks.blocks import assemble_block
    from dl1.tasks.columns import extract_task
    from dl1.tasks.gram import GRAM_DTYPE

    rng = np.random.default_rng(int(density * 100) + weighted)
    n, p = 50, 36
    X = sp.random(n, p, density=density, format="csc", random_state=rng)
    s = rng.uniform(0.5, 2.0, n) if weighted else np.zeros(0)
    sv = np.ones(n) if not weighted else s
    cb = np.array([0, 17, p])
    blocks = [assemble_block(j, cb[j], s, True, True, X[:, cb[j] : cb[j + 1]]) for j in range(2)]
    scale = np.concatenate([b.col_scale for b in blocks])
    Xs = X.toarray() * scale
    c_all = Xs.T @ sv / np.sqrt(n * sv.sum())
    full = Xs.T @ (sv[:, None] * Xs) / n - np.outer(c_all, c_all)
    ex = LocalExecutor()

    def groups_for(ids):
        out = []
        for j in range(2):
            g = ids[(ids >= cb[j]) & (ids < cb[j + 1])]
            if g.shape[0]:
                out.append(CachedGroup(extract_task(blocks[j], g - cb[j]), g, True))
        return out

    def gram(groups, ws, prev):
        if shares:
            plan = spread_plan(groups, ws, np.array([0, 1]), cb, np.ones(p), 1.0)
            assert len(plan) == sum(np.isin(g, ws).any() for _, g, _ in groups)
        else:
            plan = spread_plan(groups, ws, np.array([0, 1]), cb)
            assert len(plan) == 2
        ids = np.concatenate([gids[keep] for _, grp in plan for _, gids, keep in grp])
        got = spread_gram_task(ex, plan, ids, prev, c_all[ids], n, s, 12 * 7 * p, 10 * p)
        return got, ids

    ws1 = np.sort(rng.choice(p, 14, replace=False))
    groups = groups_for(ws1)
    g1, ids1 = gram(groups, ws1, None)
    Q1 = g1[0][1]
    assert Q1.dtype == GRAM_DTYPE and g1[0][0] is ids1
    tol = dict(rtol=2.0**-22, atol=1e-7 * np.abs(full).max())
    np.testing.assert_allclose(Q1, full[np.ix_(ids1, ids1)], **tol)
    ws2 = np.union1d(ws1[::2], np.sort(rng.choice(p, 12, replace=False)))
    groups += groups_for(np.setdiff1d(ws2, ws1))
    g2, ids2 = gram(groups, ws2, g1)
    Q2 = g2[0][1]
    np.testing.assert_allclose(Q2, full[np.ix_(ids2, ids2)], **tol)
    kept = np.flatnonzero(np.isin(ids2, ids1))
    old = np.searchsorted(ids1, ids2[kept], sorter=np.argsort(ids1))
    old = np.argsort(ids1)[old]
    np.testing.assert_array_equal(Q2[np.ix_(kept, kept)], Q1[np.ix_(old, old)])
    assert gram(groups, ws2, g2)[0] is g2  # the same working set: no work
