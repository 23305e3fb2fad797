"""``dl1.fit_multiclass``: multinomial logistic regression with an L1, elastic-net or
grouped penalty, certified by its duality gap, every pass over the data shared by all
classes (:mod:`dl1.solvers.multiclass`)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from dl1.errors import ValidationError
from dl1.inputs import read_inputs
from dl1.loading import decide_stream, load_blocks
from dl1.objective.datafits.multinomial import Multinomial
from dl1.objective.penalties.elastic_net import ElasticNet
from dl1.objective.penalties.group import GroupElasticNet
from dl1.params import MULTICLASS, validated
from dl1.runtime.executor import coordinating, executor_for
from dl1.solvers.multiclass import (
    MulticlassProblem,
    MulticlassResult,
    MulticlassWorkingSetSolver,
)
from dl1.solvers.result import ConvergenceWarning


@coordinating
@validated(MULTICLASS, "dl1.fit_multiclass()")
def fit_multiclass(
    X: Any,
    y: Any = None,
    *,
    alpha: float,
    l1_ratio: float = 1.0,
    penalty: str = "l1",
    sample_weight: Any = None,
    fit_intercept: bool = True,
    tol: float = 1e-4,
    max_rounds: int = 100,
    max_epochs: int = 5000,
    n_partitions: int = 2,
    stream: bool | None = None,
    client: Any = None,
    split: str = "train",
    verbose: bool = False,
    callback: Any = None,
) -> MulticlassResult:
    """Fit a multinomial logistic regression, certified by its duality gap.

    Minimises ``(1/n) sum_i (lse(z_i) - z_{i, y_i}) + alpha (l1_ratio R(W) + (1 - l1_ratio)
    / 2 ||W||_F^2)`` over ``W`` (``p x K``) and the intercepts ``b``, with ``Z = X W + 1 b^T``
    and ``R`` the entry-wise l1 norm (``penalty="l1"``: scikit-learn's multinomial
    ``LogisticRegression`` with ``C = 1 / (n alpha)``) or the sum of the rows' Euclidean
    norms (``penalty="grouped"``: glmnet's ``type.multinomial = "grouped"``, a feature in or
    out for every class at once).

    Parameters
    ----------
    X, y
        As in :func:`dl1.fit`; ``y`` holds class labels (any sortable values, at least two
        classes), read from the store when ``X`` is one.
    alpha, l1_ratio : float
        The penalty's strength and its l1 (or grouped) share.
    penalty : {"l1", "grouped"}
    sample_weight : array-like (n,), optional
        Non-negative weights (those of a store when ``X`` is one and this is None).
    fit_intercept : bool
    tol : float
        Target duality gap relative to the loss at the best constant.
    max_rounds, max_epochs : int
        Passes over the data, and epochs of one subproblem, at most.
    n_partitions, stream, client, split
        As in :func:`dl1.fit` (blocks in worker memory, or re-read from the store).

    Returns
    -------
    MulticlassResult
        ``coef_`` (sparse, ``(K, p)``), ``intercept_``, ``classes_``, ``gap_``,
        ``n_rounds_``; a :class:`dl1.ConvergenceWarning` says the gap reached when a bound
        stopped the fit first.
    """
    del verbose, callback  # accepted as every entry point does; rounds are in history_
    classes, codes, inputs = _labelled_inputs(X, y, sample_weight, split)
    ex = executor_for(client)
    if inputs.dataset is not None:
        raise ValidationError("fit_multiclass takes a store, a dask array or a matrix")
    streamed = decide_stream(stream, inputs.store, split, ex)
    sw = inputs.sample_weight
    blocks, cb = load_blocks(ex, inputs.X, sw, False, False, n_partitions,
                             inputs.store, split, streamed, local=inputs.local)  # fmt: skip
    if not streamed:
        ex.wait(blocks)
    pen = (GroupElasticNet(alpha, l1_ratio) if penalty == "grouped"
           else ElasticNet(alpha, l1_ratio))  # fmt: skip
    prob = MulticlassProblem(ex, blocks, np.asarray(cb), codes, classes.shape[0], pen,
                             fit_intercept, n_partitions, sw)  # fmt: skip
    solver = MulticlassWorkingSetSolver(tol=tol, max_rounds=max_rounds, max_epochs=max_epochs)
    res = solver.solve(prob)
    res.classes_ = classes
    if not res.converged_:
        warnings.warn(
            f"the multinomial fit stopped at relative duality gap {res.gap_:.3g} > tol {tol:g} "
            f"after {res.n_rounds_} rounds (max_rounds={max_rounds}, max_epochs={max_epochs})",
            ConvergenceWarning, stacklevel=3,
        )  # fmt: skip
    return res


def _labelled_inputs(X: Any, y: Any, sample_weight: Any, split: str):
    """``(classes, codes, inputs)``: the labels encoded once, the data and weights read as
    a squared loss's (the codes are numbers; the class values are kept aside). A class
    whose samples all weigh 0 is refused (its coefficients would have no data)."""
    if y is not None:
        classes, codes = Multinomial.encode(y)
        inputs = read_inputs(X, codes.astype(np.float64), sample_weight, "squared", split)
    else:
        inputs = read_inputs(X, None, sample_weight, "squared", split)
        classes, codes = Multinomial.encode(inputs.y)
    sw = inputs.sample_weight
    if sw.shape[0]:
        weight = np.bincount(codes, weights=sw, minlength=classes.shape[0])
        if not (weight > 0).all():
            raise ValidationError(
                f"class {classes[int(np.argmin(weight > 0))].item()!r} has no sample of positive "
                "weight: every class needs one"
            )
    return classes, codes, inputs
