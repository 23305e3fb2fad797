"""Lazy elastic-net SGD / FoBoS passes against a dense NumPy transcription of the steps."""

from __future__ import annotations

import numpy as np
import pytest

from dl1.kernels.lazy import FORM_CODES, RESCALE_BELOW, dense_pass, lazy_pass
from tests.helpers import random_csr
from tests.kernel_helpers import LOSS_CODES


def reference_loss_derivative(loss: str, y: float, z: float, gamma: float) -> float:
    if loss == "squared":
        return z - y
    m = y * z
    if loss == "logistic":
        return -y / (1.0 + np.exp(m))
    if loss == "hinge":
        return -y if m < 1 else 0.0
    if m >= 1:
        return 0.0
    return -y if m <= 1 - gamma else -y * (1 - m) / gamma


def reference_pass(X, y, sw, rows, eta, w, b, fit_intercept, l1, l2, form, loss, gamma):
    """Every step applied to every weight, in NumPy (the definition the kernel must meet)."""
    Xd = X.toarray()
    w = w.copy()
    for t, r in enumerate(rows):
        z = Xd[r] @ w + b
        g = sw[r] * reference_loss_derivative(loss, y[r], z, gamma)
        w = w - eta[t] * g * Xd[r]
        if fit_intercept:
            b -= eta[t] * g
        if form == "sgd":
            mag = (1 - eta[t] * l2) * np.abs(w) - eta[t] * l1
        else:
            mag = (np.abs(w) - eta[t] * l1) / (1 + eta[t] * l2)
        w = np.sign(w) * np.maximum(mag, 0.0)
    return w, b


def problem(loss: str, seed: int = 0, n: int = 60, p: int = 40):
    X = random_csr(n, p, 0.15, seed=seed)
    rng = np.random.default_rng(seed)
    z = X @ rng.standard_normal(p)
    y = z + 0.1 * rng.standard_normal(n) if loss == "squared" else np.where(z > 0, 1.0, -1.0)
    sw = rng.uniform(0.5, 1.5, n)
    return X, y, sw, rng


SCHEDULES = {
    "constant": lambda T, eta0: np.full(T, eta0),
    "inverse": lambda T, eta0: eta0 / (1 + 0.05 * np.arange(T)),
    "invsqrt": lambda T, eta0: eta0 / np.sqrt(1 + np.arange(T)),
}
PENALTIES = {"l1": (1.0, 0.0), "l2": (0.0, 1.0), "enet": (0.5, 0.5)}


@pytest.mark.parametrize("form", ["sgd", "fobos"])
@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("penalty", sorted(PENALTIES))
@pytest.mark.parametrize("loss", sorted(LOSS_CODES))
def test_lazy_pass_equals_dense_reference(form, schedule, penalty, loss):
    """Pass: weights, intercept of three epochs of lazy updates (in a shuffled order, rows
    visited several times) equal the dense reference to 1e-10."""
    X, y, sw, rng = problem(loss)
    alpha = 0.05
    l1, l2 = (alpha * f for f in PENALTIES[penalty])
    rows = np.concatenate([rng.permutation(X.shape[0]) for _ in range(3)]).astype(np.int64)
    eta = SCHEDULES[schedule](rows.size, 0.1)
    w0 = rng.standard_normal(X.shape[1]) * (rng.random(X.shape[1]) < 0.5)
    expected_w, expected_b = reference_pass(
        X, y, sw, rows, eta, w0, 0.3, True, l1, l2, form, loss, 0.5
    )
    w = w0.copy()
    b, prog = lazy_pass(X.indptr, X.indices, X.data, y, sw, rows, eta, w, 0.3, True, l1, l2,
                        FORM_CODES[form], LOSS_CODES[loss], 0.5)
    np.testing.assert_allclose(w, expected_w, rtol=0, atol=1e-10)
    assert abs(b - expected_b) <= 1e-10
    assert np.isfinite(prog) and prog >= 0
    # the O(d)-per-step kernel is the same algorithm
    wd = w0.copy()
    bd, progd = dense_pass(X.indptr, X.indices, X.data, y, sw, rows, eta, wd, 0.3, True, l1, l2,
                           FORM_CODES[form], LOSS_CODES[loss], 0.5)
    np.testing.assert_allclose(wd, expected_w, rtol=0, atol=1e-10)
    assert abs(bd - b) <= 1e-10 and abs(progd - prog) <= 1e-8 * max(1.0, prog)


@pytest.mark.parametrize("form", ["sgd", "fobos"])
def test_rescaling_of_the_cached_products_keeps_the_updates_exact(form):
    """Pass: with a strong ridge part the cached product falls below RESCALE_BELOW many
    times in one pass (every weight is then brought current and the caches restart); the
    weights still equal the dense reference to 1e-10, with features absent for hundreds of
    steps."""
    X, y, sw, rng = problem("squared", seed=3, n=400, p=30)
    rows = np.tile(np.arange(400, dtype=np.int64), 2)
    eta = np.full(rows.size, 0.5)
    l1, l2 = 0.01, 1.0  # a_t = 0.5 (SGD) or 2/3 (FoBoS): P < 1e-100 within ~570 steps
    assert (0.5 if form == "sgd" else 2 / 3) ** rows.size < RESCALE_BELOW
    w0 = rng.standard_normal(30)
    expected_w, expected_b = reference_pass(X, y, sw, rows, eta, w0, 0.0, False, l1, l2, form,
                                            "squared", 1.0)
    w = w0.copy()
    b, _ = lazy_pass(X.indptr, X.indices, X.data, y, sw, rows, eta, w, 0.0, False, l1, l2,
                     FORM_CODES[form], LOSS_CODES["squared"], 1.0)
    np.testing.assert_allclose(w, expected_w, rtol=0, atol=1e-10)
    assert b == 0.0 == expected_b


def test_progressive_loss_is_the_loss_before_each_step():
    """Pass: the progressive validation loss of a pass equals the sum of each example's
    loss at the prediction made just before its step (recomputed densely)."""
    X, y, sw, rng = problem("logistic", seed=5)
    rows = rng.permutation(X.shape[0]).astype(np.int64)
    eta = np.full(rows.size, 0.2)
    w = np.zeros(X.shape[1])
    Xd, expected, wr, br = X.toarray(), 0.0, np.zeros(X.shape[1]), 0.0
    for t, r in enumerate(rows):
        z = Xd[r] @ wr + br
        expected += sw[r] * np.log1p(np.exp(-y[r] * z))
        wr, br = reference_pass(X, y, sw, rows[t:t + 1], eta[t:t + 1], wr, br, True, 0.01,
                                0.0, "fobos", "logistic", 1.0)
    _, prog = lazy_pass(X.indptr, X.indices, X.data, y, sw, rows, eta, w, 0.0, True, 0.01, 0.0,
                        FORM_CODES["fobos"], LOSS_CODES["logistic"], 1.0)
    assert prog == pytest.approx(expected, rel=1e-12)
