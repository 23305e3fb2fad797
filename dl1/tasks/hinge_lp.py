"""The L1-regularised hinge restricted to a working set, solved exactly as a linear program.

On the working set's columns ``X_W`` (gathered on one worker) the problem

    min_{w, b} (1/n) sum_i s_i max(0, 1 - y_i (x_i^T w + b)) + alpha_l1 ||w||_1

is the LP over ``(w+, w-, b, xi)`` of cost ``alpha_l1 (1^T w+ + 1^T w-) + s^T xi / n`` with
``xi_i >= 1 - y_i (x_i^T (w+ - w-) + b)``, ``w+, w-, xi >= 0`` (Zhu, Rosset, Hastie &
Tibshirani, "1-norm support vector machines", NIPS 2003), solved by HiGHS's interior
point method with crossover (:func:`scipy.optimize.linprog`; its dual simplex took 14x as
long on 20,000 rows). Its multipliers ``lambda_i`` of the margin constraints
give the hinge's dual point ``theta = n lambda y``: ``c = n lambda / s`` lies in ``[0, 1]``,
``sum theta = 0`` (the intercept's column) and ``|x_j^T theta| <= n alpha_l1`` on the
working set (the columns of ``w+`` and ``w-``). The coordinator's pass over every column
certifies it.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from dl1.errors import NumericalError
from dl1.kernels.margins import balance
from dl1.tasks.columns import gather_columns
from dl1.tasks.records import ColumnGroup

#: HiGHS's primal and dual feasibility tolerances: the certificate is computed afresh from
#: the answer, so they bound how close to the LP's optimum the answer (and its gap) gets.
LP_TOLERANCE = 1e-10


class HingeLP(NamedTuple):
    """The restricted LP's answer: the working set's coefficients, the intercept, ``z = X_W
    w + b``, the dual point ``theta`` and the seconds it took."""

    w: np.ndarray
    intercept: float
    z: np.ndarray
    theta: np.ndarray
    seconds: float


def hinge_lp_task(
    extracts: list[ColumnGroup],
    extract_ids: list[np.ndarray],
    ws: np.ndarray,
    y: np.ndarray,
    sample_weight: np.ndarray,
    alpha_l1: float,
    fit_intercept: bool,
) -> HingeLP:
    """Solve the hinge LP on the columns ``ws`` (picked from the cached groups ``extracts``
    of feature ids ``extract_ids``); ``sample_weight`` empty for unit weights."""
    t0 = time.perf_counter()
    n, m = y.shape[0], ws.shape[0]
    indptr, indices, data, scale, _ = gather_columns(extracts, extract_ids, ws)
    X = sp.csc_matrix((data, indices, indptr), shape=(n, m))
    if scale.shape[0]:
        X = X @ sp.diags(scale)
    s = np.ones(n) if sample_weight.shape[0] == 0 else sample_weight
    yX = sp.diags(y) @ X
    parts = [-yX, yX] + ([sp.csc_matrix(-y[:, None])] if fit_intercept else []) + [-sp.eye(n)]
    a_ub = sp.hstack(parts, format="csc")
    n_b = int(fit_intercept)
    cost = np.concatenate([np.full(2 * m, alpha_l1), np.zeros(n_b), s / n])
    bounds = [(0, None)] * (2 * m) + [(None, None)] * n_b + [(0, None)] * n
    # local: scipy.optimize takes about a second to import, paid by the hinge's LP only
    from scipy.optimize import linprog

    res = linprog(
        cost, A_ub=a_ub, b_ub=-np.ones(n), bounds=bounds, method="highs-ipm",
        options={"primal_feasibility_tolerance": LP_TOLERANCE,
                 "dual_feasibility_tolerance": LP_TOLERANCE},
    )  # fmt: skip
    if res.status != 0:
        raise NumericalError(f"the hinge LP on {m} features failed: {res.message}")
    w = res.x[:m] - res.x[m : 2 * m]
    b = float(res.x[2 * m]) if fit_intercept else 0.0
    z = X @ w + b
    # lambda_i = -marginal_i in [0, s_i / n]; rounding clipped, the balance restored
    c = np.divide(-n * res.ineqlin.marginals, s, out=np.zeros(n), where=s > 0)
    theta = s * y * np.clip(c, 0.0, 1.0)
    if fit_intercept:
        balance(theta)
    return HingeLP(w, b, np.asarray(z, dtype=np.float64), theta, time.perf_counter() - t0)
