"""``dl1.fit_multiclass``: multinomial logistic regression with an L1, elastic-net or
grouped penalty (:mod:`dl1.solvers.multiclass`), or one-vs-rest logistic, squared-hinge
or hinge classifiers (:mod:`dl1.solvers.ovr`), certified by their duality gaps, every pass
over the data shared by all classes."""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sp

from dl1.entry_labels import stored_labels
from dl1.errors import ValidationError
from dl1.inputs import normalized_weights, read_inputs
from dl1.loading import col_scales, decide_stream, load_blocks
from dl1.objective.datafits import datafit_class, make_datafit
from dl1.objective.datafits.multinomial import Multinomial
from dl1.objective.penalties.elastic_net import ElasticNet
from dl1.objective.penalties.group import GroupElasticNet
from dl1.params import MULTICLASS, validated
from dl1.runtime.compute import computed
from dl1.runtime.executor import coordinating, executor_for
from dl1.solvers.class_start import WarmStart
from dl1.solvers.multiclass import (
    MulticlassProblem,
    MulticlassResult,
    MulticlassWorkingSetSolver,
)
from dl1.solvers.ovr import OneVsRestSolver, OvrProblem, OvrResult
from dl1.solvers.result import convergence_warning


@coordinating
@validated(MULTICLASS, "dl1.fit_multiclass()")
def fit_multiclass(
    X: Any,
    y: Any = None,
    *,
    alpha: float,
    l1_ratio: float = 1.0,
    penalty: str = "l1",
    multi_class: str = "multinomial",
    loss: str = "logistic",
    sample_weight: Any = None,
    fit_intercept: bool = True,
    tol: float = 1e-4,
    max_rounds: int = 100,
    max_epochs: int = 5000,
    coef_init: Any = None,
    intercept_init: Any = None,
    standardize: bool = False,
    n_partitions: int = 2,
    stream: bool | None = None,
    client: Any = None,
    split: str = "train",
    verbose: bool = False,
    callback: Any = None,
) -> MulticlassResult | OvrResult:
    """Fit a multinomial logistic regression, or ``K`` one-vs-rest binary classifiers,
    certified by their duality gaps.

    Minimises ``(1/n) sum_i (lse(z_i) - z_{i, y_i}) + alpha (l1_ratio R(W) + (1 - l1_ratio)
    / 2 ||W||_F^2)`` over ``W`` (``p x K``) and the intercepts ``b``, with ``Z = X W + 1 b^T``
    and ``R`` the entry-wise l1 norm (``penalty="l1"``: scikit-learn's multinomial
    ``LogisticRegression`` with ``C = 1 / (n alpha)``) or the sum of the rows' Euclidean
    norms (``penalty="grouped"``: glmnet's ``type.multinomial = "grouped"``, a feature in or
    out for every class at once).

    With ``multi_class="ovr"`` (liblinear's one-vs-rest), class ``k`` against the rest is
    the binary problem of :func:`dl1.fit` with labels ``+1`` on its samples and ``-1``
    elsewhere, the ``loss`` (logistic, squared hinge or hinge) and the elastic net, each
    class with its own intercept and certified by its own duality gap; the ``K`` problems
    share every pass over ``X`` (one scan computes ``X^T Theta`` for the ``n x K`` matrix of
    the classes' dual points), so the fit takes about the rounds of the slowest class's
    binary fit, not ``K`` times as many.

    Parameters
    ----------
    X, y
        As in :func:`dl1.fit`; ``y`` holds class labels (any sortable values, at least two
        classes), read from the store when ``X`` is one.
    alpha, l1_ratio : float
        The penalty's strength and its l1 (or grouped) share.
    penalty : {"l1", "grouped"}
        ``"grouped"`` is multinomial only.
    multi_class : {"multinomial", "ovr"}
        One model over the softmax of the ``K`` decision values, or ``K`` one-vs-rest
        binary problems.
    loss : {"logistic", "squared_hinge", "hinge"}
        The one-vs-rest binary loss (the multinomial model is logistic). The hinge takes
        the pure L1 penalty only (``l1_ratio=1``; exact LP working sets, as
        ``dl1.fit(solver="smoothing")``).
    sample_weight : array-like (n,), optional
        Non-negative weights (those of a store when ``X`` is one and this is None).
    fit_intercept : bool
    tol : float
        Target duality gap relative to the loss at the best constant.
    max_rounds, max_epochs : int
        Passes over the data, and epochs of one subproblem, at most.
    coef_init, intercept_init : array-like ``(K, p)`` (dense or sparse) and ``(K,)``, optional
        Where the fit starts (a nearby answer, such as the previous fit's ``coef_`` and
        ``intercept_`` for the same classes: scikit-learn's ``warm_start``); rows in the
        order of the sorted classes. None: zeros, and the intercepts of ``W = 0``.
    standardize : bool
        Fit on columns scaled to unit (weighted) standard deviation, centred with an
        intercept (as :func:`dl1.fit`'s): the penalty then weighs every feature's spread
        alike. ``coef_`` (and ``coef_init``) are in the input's scale.
    n_partitions, stream, client, split
        As in :func:`dl1.fit` (blocks in worker memory, or re-read from the store).
    verbose, callback
        A line, or a call with the round's history entry, per round (the entries are also
        in ``history_``).

    Returns
    -------
    MulticlassResult or OvrResult
        ``coef_`` (sparse, ``(K, p)``), ``intercept_``, ``classes_``, ``gap_``,
        ``n_rounds_`` (one-vs-rest: also each class's ``gaps_``); a
        :class:`dl1.ConvergenceWarning` says the gap reached when a bound stopped the fit
        first.
    """
    _check_choices(multi_class, loss, penalty, l1_ratio)
    data = load_labelled(X, y, sample_weight, split, client, n_partitions, stream, standardize,
                         fit_intercept)  # fmt: skip
    start = warm_start(coef_init, intercept_init, data.n_classes, int(data.col_bounds[-1]))
    return fit_labelled(data, alpha=alpha, l1_ratio=l1_ratio, penalty=penalty,
                        multi_class=multi_class, loss=loss, fit_intercept=fit_intercept,
                        tol=tol, max_rounds=max_rounds, max_epochs=max_epochs, start=start,
                        verbose=verbose, callback=callback, stacklevel=5)  # fmt: skip


def fit_labelled(data: LabelledBlocks, *, alpha: float, l1_ratio: float, penalty: str,
                 multi_class: str, loss: str, fit_intercept: bool = True, tol: float = 1e-4,
                 max_rounds: int = 100, max_epochs: int = 5000, start: WarmStart | None = None,
                 verbose: bool = False, callback: Any = None,
                 stacklevel: int = 2) -> MulticlassResult | OvrResult:  # fmt: skip
    """:func:`fit_multiclass` on data already loaded (the options checked by the caller;
    ``start`` and the answer in the input's scale); a :class:`ConvergenceWarning` at
    ``stacklevel`` when a bound stops the fit."""
    start = data.solver_start(start)
    if multi_class == "ovr":
        prob = OvrProblem(data.ex, data.blocks, data.col_bounds, data.codes, data.n_classes,
                          make_datafit(loss), ElasticNet(alpha, l1_ratio), fit_intercept, tol,
                          data.n_partitions, data.sample_weight)  # fmt: skip
        solver = OneVsRestSolver(max_rounds=max_rounds, max_inner_epochs=max_epochs,
                                 verbose=verbose, callback=callback)  # fmt: skip
        res = solver.solve(prob, start)
        res.coef_ = data.input_coef(res.coef_)
        return _warned(res, data.classes, max_rounds, stacklevel + 1)
    prob = data.problem(multinomial_penalty(penalty, alpha, l1_ratio), fit_intercept)
    solver = MulticlassWorkingSetSolver(tol=tol, max_rounds=max_rounds, max_epochs=max_epochs,
                                        verbose=verbose, callback=callback)  # fmt: skip
    res = solver.solve(prob, start)
    res.classes_, res.coef_ = data.classes, data.input_coef(res.coef_)
    warn_unconverged(res, max_rounds, max_epochs, stacklevel=stacklevel)
    return res


class LabelledBlocks(NamedTuple):
    """A multiclass problem's data, loaded once: the classes and the rows' class codes,
    the executor with its feature blocks (futures or sources) and their column bounds,
    the normalised sample weights (empty for unit ones), and the columns' scales when
    standardised (``1 / std_j``, 0 for a constant column; empty otherwise): the solvers
    work on the scaled columns, and their coefficients are mapped back to the input's."""

    classes: np.ndarray
    codes: np.ndarray
    ex: Any
    blocks: list[Any]
    col_bounds: np.ndarray
    sample_weight: np.ndarray
    n_partitions: int
    scales: np.ndarray = np.zeros(0)

    @property
    def n_classes(self) -> int:
        return int(self.classes.shape[0])

    def reweighted(self, sample_weight: Any) -> LabelledBlocks:
        """This data with other sample weights (None: unit), checked and normalised as
        :func:`load_labelled` checks them. The blocks are kept: their squared norms (the
        subproblems' curvature floors, not the certificate) stay those of the weights they
        were loaded with."""
        sw = normalized_weights(sample_weight, self.codes.shape[0])
        check_class_weights(self.classes, self.codes, sw)
        return self._replace(sample_weight=sw)

    def input_coef(self, coef: sp.csr_matrix) -> sp.csr_matrix:
        """Coefficients ``(K, p)`` of the scaled columns as the input columns' (``w_j
        scale_j``)."""
        return coef if not self.scales.shape[0] else sp.csr_matrix(coef @ sp.diags(self.scales))

    def solver_start(self, start: WarmStart | None) -> WarmStart | None:
        """A start given in the input's scale as the scaled columns' (``w_j / scale_j``; a
        constant column's coefficients 0, as the fit keeps them)."""
        if start is None or not self.scales.shape[0]:
            return start
        s = self.scales[start.support]
        inv = np.divide(1.0, s, out=np.zeros_like(s), where=s > 0)
        return start._replace(W=start.W * inv[:, None])

    def problem(self, penalty: ElasticNet | GroupElasticNet,
                fit_intercept: bool) -> MulticlassProblem:  # fmt: skip
        """The multinomial problem of this data with ``penalty``."""
        return MulticlassProblem(self.ex, self.blocks, self.col_bounds, self.codes,
                                 self.n_classes, penalty, fit_intercept, self.n_partitions,
                                 self.sample_weight)  # fmt: skip


def load_labelled(X: Any, y: Any, sample_weight: Any, split: str, client: Any,
                  n_partitions: int, stream: bool | None, standardize: bool = False,
                  center: bool = False) -> LabelledBlocks:  # fmt: skip
    """Read and check the labels and weights, then load (or locate, streamed) the blocks,
    their columns scaled to unit (weighted; centred when ``center``) deviation when
    ``standardize`` (:func:`dl1.tasks.blocks.assemble_block`)."""
    classes, codes, inputs = _labelled_inputs(X, y, sample_weight, split)
    ex = executor_for(client)
    if inputs.dataset is not None:
        raise ValidationError("a multiclass fit takes a store, a dask array or a matrix")
    streamed = decide_stream(stream, inputs.store, split, ex)
    sw = inputs.sample_weight
    blocks, cb = load_blocks(ex, inputs.X, sw, standardize, center, n_partitions,
                             inputs.store, split, streamed, local=inputs.local)  # fmt: skip
    if not streamed:
        ex.wait(blocks)
    scales = col_scales(ex, blocks) if standardize else np.zeros(0)
    return LabelledBlocks(classes, codes, ex, blocks, np.asarray(cb), sw, n_partitions, scales)


def warm_start(coef: Any, intercept: Any, K: int, p: int) -> WarmStart | None:
    """The start at ``coef`` ``(K, p)`` and ``intercept`` ``(K,)`` (either may be None:
    zeros; the solvers then start the intercepts at those of ``W = 0``), checked."""
    if coef is None and intercept is None:
        return None
    W = sp.csr_matrix((K, p)) if coef is None else sp.csr_matrix(coef, dtype=np.float64)
    if W.shape != (K, p) or not np.isfinite(W.data).all():
        raise ValidationError(
            f"coef_init must be {K} x {p} finite values (a row per class, in the order of "
            f"the sorted classes; a column per feature); got shape {W.shape}"
        )
    b = None if intercept is None else np.asarray(intercept, np.float64).ravel()
    if b is not None and (b.shape != (K,) or not np.isfinite(b).all()):
        raise ValidationError(
            f"intercept_init must be {K} finite values (one per class); got shape {b.shape}"
        )
    start = WarmStart.from_coef(W, b)
    return start if b is not None or start.support.shape[0] else None


def multinomial_penalty(penalty: str, alpha: float,
                        l1_ratio: float) -> ElasticNet | GroupElasticNet:  # fmt: skip
    """The multinomial model's penalty object by its name."""
    return GroupElasticNet(alpha, l1_ratio) if penalty == "grouped" else ElasticNet(alpha, l1_ratio)


def warn_unconverged(res: MulticlassResult, max_rounds: int, max_epochs: int,
                     stacklevel: int = 2, where: str = "") -> None:  # fmt: skip
    """A :class:`ConvergenceWarning` with the gap reached when a bound stopped the fit."""
    if not res.converged_:
        warnings.warn(
            f"the multinomial fit{where} stopped at relative duality gap {res.gap_:.3g} > tol "
            f"{res.tol:g} after {res.n_rounds_} rounds (max_rounds={max_rounds}, "
            f"max_epochs={max_epochs})", convergence_warning(), stacklevel=stacklevel + 1,
        )  # fmt: skip


#: The binary entry points' settings a multiclass fit does not take, with their "off" value.
BINARY_ONLY = {"penalty_factor": None, "positive": False, "bounds": None,
               "screen": False, "spread": None, "coef_init": None, "intercept_init": None,
               "solver": "ws", "cv": None, "checkpoint": None, "X_test": None}  # fmt: skip


def many_classes(X: Any, y: Any, loss: str, split: str) -> bool:
    """Whether a classification ``loss``'s labels (``y``, or those stored with ``X``) are
    those of more than two classes: :func:`dl1.fit` and :func:`dl1.path` then fit the
    multiclass model (see :func:`class_labels`)."""
    return class_labels(X, y, loss, split) is not None


def class_labels(X: Any, y: Any, loss: str, split: str) -> np.ndarray | None:
    """The labels (``y``, or those stored with ``X``) of a classification ``loss`` when they
    are those of more than two classes (scikit-learn's ``type_of_target``: integral or not
    numbers; continuous targets given a classification loss are left to the binary
    reading, which names them), else None."""
    if not datafit_class(loss).classifies:
        return None
    given = y if y is not None else stored_labels(X, split)
    if given is None:
        return None
    if hasattr(given, "compute"):
        (given,) = computed(given, what="y")
    given = np.asarray(given)
    if given.ndim == 2 and given.shape[1] == 1:
        given = given.ravel()
    if given.ndim != 1 or given.dtype.kind == "f" and not np.isfinite(given).all():
        return None  # the binary labels' reading names the bad value
    # local: scikit-learn takes about a second to import, which `dl1 --help` would pay
    from sklearn.utils.multiclass import type_of_target

    return given if type_of_target(given) == "multiclass" else None


def multiclass_scheme(loss: str, where: str, **settings: Any) -> dict[str, str]:
    """``fit_multiclass``'s scheme for a binary entry point's ``loss`` (logistic: the
    multinomial model; the hinges: one-vs-rest), after refusing the ``settings`` it does
    not take (:data:`BINARY_ONLY`) unless they are off."""
    for name, value in settings.items():
        off = BINARY_ONLY[name]
        if not (value is off if off is None or isinstance(off, bool) else value == off):
            raise ValidationError(
                f"{where}: {name}={value!r} is not supported with more than two classes "
                "(the multiclass fit, dl1.fit_multiclass)"
            )
    if loss == "logistic":
        return {"multi_class": "multinomial"}
    if loss in ("hinge", "squared_hinge"):
        return {"multi_class": "ovr", "loss": loss}
    raise ValidationError(
        f"{where}: loss={loss!r} has no multiclass model; with more than two classes use "
        "'logistic' (multinomial) or 'hinge' / 'squared_hinge' (one-vs-rest)"
    )


def _check_choices(multi_class: str, loss: str, penalty: str, l1_ratio: float) -> None:
    """The combinations the parameters' own constraints cannot say."""
    if multi_class == "multinomial" and loss != "logistic":
        raise ValidationError(
            f"loss={loss!r} needs multi_class='ovr': the multinomial model is logistic"
        )
    if multi_class == "ovr" and penalty != "l1":
        raise ValidationError(
            f"penalty={penalty!r} is multinomial only; one-vs-rest takes penalty='l1' "
            "(with l1_ratio for the elastic net)"
        )
    if multi_class == "ovr" and loss == "hinge" and l1_ratio != 1.0:
        raise ValidationError(
            f"the one-vs-rest hinge takes the pure L1 penalty (l1_ratio=1); got l1_ratio="
            f"{l1_ratio!r}: use loss='squared_hinge' or 'logistic' for the elastic net"
        )


def _warned(res: OvrResult, classes: np.ndarray, max_rounds: int,
            stacklevel: int) -> OvrResult:  # fmt: skip
    """``res`` with its class labels; a :class:`ConvergenceWarning` naming the classes a
    bound stopped above ``tol``, with their gaps."""
    res.classes_ = classes
    if not res.converged_:
        bad = np.flatnonzero(~res.converged_classes_)
        named = ", ".join(f"{classes[k].item()!r} ({res.gaps_[k]:.3g})" for k in bad[:5])
        warnings.warn(
            f"the one-vs-rest fit stopped with {bad.shape[0]} of {classes.shape[0]} classes "
            f"above tol {res.tol:g} (relative duality gaps: {named}) after {res.n_rounds_} "
            f"rounds (max_rounds={max_rounds}); see history_",
            convergence_warning(), stacklevel=stacklevel,
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
    check_class_weights(classes, codes, inputs.sample_weight)
    return classes, codes, inputs


def check_class_weights(classes: np.ndarray, codes: np.ndarray, sw: np.ndarray) -> None:
    """Refuse weights (normalised; empty: unit) under which a class has no sample of
    positive weight (its coefficients would have no data)."""
    if sw.shape[0]:
        weight = np.bincount(codes, weights=sw, minlength=classes.shape[0])
        if not (weight > 0).all():
            raise ValidationError(
                f"class {classes[int(np.argmin(weight > 0))].item()!r} has no sample of positive "
                "weight: every class needs one"
            )
