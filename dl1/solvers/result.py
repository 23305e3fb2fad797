"""What a solve of the penalised problem returns, and how it warns when not certified."""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import numpy as np

from dl1.labels import checked_classes
from dl1.predict import LinearPredictor
from dl1.saving import save_model, to_sklearn
from dl1.tasks.passes import coef_parts


def __getattr__(name: str) -> Any:
    # scikit-learn (and pandas with it) loads on first use of the warning: a worker
    # importing this module for a task stays without them
    if name == "ConvergenceWarning":
        return convergence_warning()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def convergence_warning() -> type[UserWarning]:
    """``dl1.ConvergenceWarning``, made on first use (one class per process)."""
    # local: scikit-learn (~1 s, ~120 MiB to import) on the warning's first use, as said above
    from sklearn.exceptions import ConvergenceWarning as SklearnConvergenceWarning

    class ConvergenceWarning(SklearnConvergenceWarning):
        """The solver stopped at its round limit before reaching the requested gap.

        A subclass of scikit-learn's ``ConvergenceWarning`` (a ``UserWarning``): filters
        and tools set on scikit-learn's warning apply to dl1's.
        """

    ConvergenceWarning.__qualname__ = "ConvergenceWarning"  # pickled by name, as a module global
    return ConvergenceWarning


@dataclass
class FitResult(LinearPredictor):
    """Result of :func:`dl1.fit`: a fitted linear model with its certificate.

    It predicts and scores (:meth:`predict`, :meth:`decision_function`, :meth:`score`,
    :meth:`predict_proba` for the logistic loss; in memory, or lazily on a dask array,
    store or Dataset), saves itself (:meth:`save`, read back by :func:`dl1.load_model`)
    and converts to the equivalent scikit-learn estimator (:meth:`to_sklearn`).

    Attributes
    ----------
    coef_ : ndarray (p,)
        Coefficients in the scale of the input features.
    intercept_ : float
    gap_ : float
        Relative duality gap ``(P - D) / P(0)`` of the returned point.
    dual_gap_ : float
        Absolute duality gap ``P - D``.
    primal_, dual_ : float
    p0_ : float
        ``P(0)``: the objective at ``w = 0`` with the intercept fitted.
    converged_ : bool
        ``gap_ <= tol``.
    n_rounds_ : int
        Rounds run (each is one pass over the data on the workers).
    history_ : list of dict
        Per round: objective, gap (relative), nnz, seconds since start, kernel and overhead
        seconds; for the working-set solver also how its steps ran (``transport``: "local",
        "tasks" through the scheduler, or "direct" calls to the workers, see
        :mod:`dl1.runtime.rpc`); for the sample-wise solvers, the first entry also holds
        the step used (``"eta0"``, ``"rda_gamma"`` or ``"eta"``) and, when it was
        calibrated, the calibration (``"calibration"``, :mod:`dl1.solvers.calibration`).
    alpha, l1_ratio, loss, tol : the problem solved.
    passes_ : float
        Passes over the data, in units of the whole matrix (screened columns are skipped).
    screened_ : bool ndarray (p,) or None
        Features proven zero by gap-safe screening during the solve (working-set solver).
    load_seconds_, solve_seconds_ : float
        Time to read the feature blocks into worker memory, and to solve afterwards.
    streamed_ : bool
        Out-of-core mode: blocks were read from the store by every task that used them.
    fit_intercept : bool
        Whether the intercept was fitted (else ``intercept_`` is 0).
    n_samples_ : int or None
        Rows of the training data (None if unknown).
    n_features_in_ : int
        Features seen in the fit (``len(coef_)``).
    loss_params : dict
        The loss's own parameters (Huber's ``epsilon``; empty for most losses).
    classes_ : ndarray (2,) or None
        A classification loss's two labels, sorted: the fit read ``classes_[0]`` as -1 and
        ``classes_[1]`` as +1 (``[-1.0, 1.0]`` for labels -1 / +1), and :meth:`predict` and
        :meth:`score` speak them. None for the other losses, and for a model without them
        (saved before they were recorded; :func:`dl1.fit_constrained`): labels -1 / +1.
    """

    #: The kind of a saved model (:func:`dl1.saving.save_model`).
    saved_kind: ClassVar[str] = "fit"
    coef_: np.ndarray
    intercept_: float
    gap_: float
    dual_gap_: float
    primal_: float
    dual_: float
    p0_: float
    converged_: bool
    n_rounds_: int
    alpha: float
    l1_ratio: float
    loss: str
    tol: float
    n_partitions: int
    history_: list[dict[str, Any]] = field(default_factory=list)
    passes_: float = float("nan")
    screened_: np.ndarray | None = None
    load_seconds_: float = float("nan")
    solve_seconds_: float = float("nan")
    streamed_: bool = False
    fit_intercept: bool = True
    n_samples_: int | None = None
    n_features_in_: int | None = None
    loss_params: dict[str, float] = field(default_factory=dict)
    classes_: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.classes_ = checked_classes(self.classes_)
        p = int(np.shape(self.coef_)[0])
        if self.n_features_in_ is None:
            self.n_features_in_ = p
        elif self.n_features_in_ != p:
            raise ValueError(f"n_features_in_={self.n_features_in_}, but coef_ has {p} values")

    def save(self, path: Any, *, overwrite: bool = False) -> Any:
        """Write the model to the directory ``path`` (JSON and ``.npy``, no pickle), read
        back by :func:`dl1.load_model`; see :func:`dl1.saving.save_model`."""

        return save_model(self, path, overwrite=overwrite)

    def to_sklearn(self) -> Any:
        """The equivalent fitted scikit-learn estimator; see :func:`dl1.saving.to_sklearn`."""

        return to_sklearn(self)

    @property
    def overhead_fraction_(self) -> float:
        """``1 - kernel time / wall time`` over all rounds (kernel: the slowest partition's).

        Wall time is the coordinator's, from sending a round's work to holding its result:
        what remains after the kernels is scheduling, serialization and transfer.
        """
        return overhead_fraction(self.history_)

    def __repr__(self) -> str:
        return (
            f"FitResult(loss={self.loss!r}, alpha={self.alpha:.6g}, l1_ratio={self.l1_ratio}, "
            f"nnz={int(np.count_nonzero(self.coef_))}, gap={self.gap_:.3e}, "
            f"converged={self.converged_}, rounds={self.n_rounds_})"
        )


def overhead_fraction(history: list[dict[str, Any]]) -> float:
    """``1 - sum(busy_s) / sum(wall_s)`` over the rounds of a history that timed them."""
    rounds = [h for h in history if "wall_s" in h]
    wall = sum(h["wall_s"] for h in rounds)
    busy = sum(h["busy_s"] for h in rounds)
    return max(0.0, 1.0 - busy / wall) if wall > 0 else float("nan")


def coef_by_block(
    w: np.ndarray, bounds: np.ndarray, blocks: list[int], support: np.ndarray | None = None
):
    """The nonzero coefficients of each of ``blocks`` as (local ids, values), the form in
    which tasks receive a block's coefficients (:func:`dl1.tasks.passes.coef_parts`);
    ``support`` (sorted ``flatnonzero(w)``, when the caller has it) spares a scan of ``w``."""
    if not blocks:
        return []
    ranges = [(int(bounds[j]), int(bounds[j + 1])) for j in blocks]
    lo, hi = min(a for a, _ in ranges), max(b for _, b in ranges)
    if support is None:
        ids = np.flatnonzero(w[lo:hi]) + lo
    else:
        ids = support[np.searchsorted(support, lo) : np.searchsorted(support, hi)]
    return coef_parts(ids, w[ids], ranges)


class Certificate(NamedTuple):
    """A point's primal and dual objectives and their (absolute) duality gap."""

    primal: float
    dual: float
    gap: float


#: No point certified yet.
UNCERTIFIED = Certificate(np.inf, -np.inf, np.inf)


def make_result(
    problem: Any,
    w: np.ndarray,
    b: float,
    cert: Certificate,
    converged: bool,
    rounds: int,
    history: list[dict[str, Any]],
    **extra: Any,
) -> FitResult:
    """The :class:`FitResult` of a solve of ``problem`` (a :class:`dl1.solvers.base.Problem`),
    warning (ConvergenceWarning) if it is not certified."""
    penalty = problem.penalty
    rel = problem.relative_gap(cert.gap)
    res = FitResult(
        coef_=w,
        intercept_=float(b),
        gap_=float(rel),
        dual_gap_=float(cert.gap),
        primal_=float(cert.primal),
        dual_=float(cert.dual),
        p0_=float(problem.p_zero),
        converged_=converged,
        n_rounds_=rounds,
        alpha=penalty.alpha,
        l1_ratio=penalty.l1_ratio,
        loss=problem.loss,
        tol=problem.tol,
        n_partitions=len(problem.partitions),
        history_=history,
        fit_intercept=bool(problem.fit_intercept),
        n_samples_=int(problem.n),
        n_features_in_=int(problem.p),
        loss_params=problem.datafit.params(),
        **extra,
    )
    if not converged:
        why = history[-1].get("stopped") if history else None  # a solve stopped early
        warnings.warn(
            f"dl1 did not converge: relative duality gap {rel:.3e} > tol {problem.tol:.3e} "
            f"after {rounds} rounds (alpha={penalty.alpha:.6g}); "
            f"{why or 'raise max_rounds or tol'}",
            convergence_warning(),
            stacklevel=4,
        )
    return res
