"""The result of a regularisation path, with a text summary and PNG figures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from dl1.labels import checked_classes
from dl1.objective.datafits import datafit_class
from dl1.saving import save_model
from dl1.solvers.result import FitResult

#: Where a path keeps each validation metric (a loss lists its own, the first minimised to
#: choose ``best_alpha_``: ``Datafit.metrics``), its column in the summary, and whether it is
#: a score (its error is 1 - it) rather than an error.
METRIC_FIELDS = {
    "mse": ("test_mse_", "test_mse", False),
    "logloss": ("test_logloss_", "test_logloss", False),
    "accuracy": ("test_accuracy_", "test_acc", True),
}
_LABELS = {"test_mse": "test MSE", "test_logloss": "test log-loss", "test_acc": "test accuracy"}
#: Coefficient paths drawn at most (the features of largest max |coef|).
MAX_PATHS = 50
#: A float ``alpha`` names the grid alpha within this relative tolerance.
ALPHA_RTOL = 1e-12


@dataclass(repr=False, eq=False)
class PathResult:
    """Regularisation path: one fitted model per alpha, from the largest alpha down.

    Attributes
    ----------
    alphas_ : ndarray (n_alphas,)
    coefs_ : scipy.sparse.csc_matrix (p, n_alphas)
        Column ``k`` holds the coefficients of ``alphas_[k]``.
    intercepts_ : ndarray (n_alphas,)
    gaps_ : ndarray (n_alphas,)
        Relative duality gaps ``(P - D) / P(0)``.
    converged_ : bool ndarray (n_alphas,)
        False flags an alpha whose gap did not reach ``tol`` (not certified).
    n_active_ : int ndarray (n_alphas,)
        Nonzero coefficients per alpha.
    passes_ : ndarray (n_alphas,)
        Passes over the data per alpha, in units of the whole matrix.
    seconds_ : ndarray (n_alphas,)
        Wall time per alpha.
    rounds_ : int ndarray (n_alphas,)
        Solver rounds per alpha.
    l1_ratio : float
    loss : {"squared", "logistic"}
    tol : float
    test_mse_ : ndarray (n_alphas,) or None
        Test mean squared error (squared loss with test data), NaN where not computed.
    test_logloss_, test_accuracy_ : ndarray (n_alphas,) or None
        Test log-loss and accuracy (logistic loss with test data).
    extra_ : list of dict or None, optional
        Per-alpha extra data recorded by the path coordinator.
    deltas_ : ndarray (n_alphas,) or None
        Constrained (Frank-Wolfe) paths: the l1-ball radii, increasing; ``alphas_`` then
        holds the penalised Lasso alpha each solution corresponds to (see
        :class:`dl1.solvers.fw_problem.FWResult`), ``gaps_`` the relative FW gaps, and the figures
        are drawn against delta.
    fit_intercept : bool or None
        Whether intercepts were fitted (None: not recorded).
    n_samples_ : int or None
        Rows of the training data (None: not recorded).
    cv_ : dl1.paths.cv.CVResult or None
        ``dl1.path(cv=...)``: the folds' held-out scores per alpha (``cv_.scores``, the
        ``mse_path_`` of the squared loss) and the choice, also as :attr:`alpha_` and
        :attr:`alpha_1se_` (glmnet's one-standard-error alpha).
    classes_ : ndarray (2,) or None
        A classification loss's two labels, sorted (``classes_[1]`` was +1), in which the
        models of the path predict and score; as :attr:`dl1.FitResult.classes_`.

    A path predicts and scores at one of its alphas (:meth:`predict`, :meth:`score`,
    :meth:`decision_function`; ``alpha=None`` is the chosen alpha, :attr:`chosen_alpha_`),
    gives the model of one alpha (:meth:`model`, :meth:`at`), saves itself (:meth:`save`,
    read back by :func:`dl1.load_model`) and converts to scikit-learn (:meth:`to_sklearn`).
    """

    #: The kind of a saved model (:func:`dl1.saving.save_model`).
    saved_kind: ClassVar[str] = "path"
    alphas_: np.ndarray
    coefs_: sp.csc_matrix
    intercepts_: np.ndarray
    gaps_: np.ndarray
    converged_: np.ndarray
    n_active_: np.ndarray
    passes_: np.ndarray
    seconds_: np.ndarray
    rounds_: np.ndarray
    l1_ratio: float
    loss: str
    tol: float
    test_mse_: np.ndarray | None = None
    test_logloss_: np.ndarray | None = None
    test_accuracy_: np.ndarray | None = None
    extra_: list[dict[str, Any] | None] | None = None
    deltas_: np.ndarray | None = None
    fit_intercept: bool | None = None
    n_samples_: int | None = None
    cv_: Any = None
    classes_: np.ndarray | None = None

    def __post_init__(self) -> None:
        datafit_class(self.loss)  # an unknown loss is refused
        self.classes_ = checked_classes(self.classes_)
        self.alphas_ = np.asarray(self.alphas_, dtype=np.float64)
        n = self.alphas_.shape[0]
        self.coefs_ = sp.csc_matrix(self.coefs_, dtype=np.float64)
        if self.coefs_.shape[1] != n:
            raise ValueError(f"coefs_ has {self.coefs_.shape[1]} columns for {n} alphas")
        for name, dtype in (
            ("intercepts_", np.float64),
            ("gaps_", np.float64),
            ("converged_", bool),
            ("n_active_", np.int64),
            ("passes_", np.float64),
            ("seconds_", np.float64),
            ("rounds_", np.int64),
            ("test_mse_", np.float64),
            ("test_logloss_", np.float64),
            ("test_accuracy_", np.float64),
            ("deltas_", np.float64),
        ):
            v = getattr(self, name)
            if v is None:
                continue
            v = np.asarray(v, dtype=dtype)
            if v.shape != (n,):
                raise ValueError(f"{name} has shape {v.shape}, expected ({n},)")
            setattr(self, name, v)

    @classmethod
    def from_checkpoint_arrays(
        cls,
        d: dict[str, Any],
        *,
        l1_ratio: float,
        loss: str,
        tol: float,
        alphas: np.ndarray | None = None,
    ) -> PathResult:
        """Build from the dict of :meth:`dl1.paths.PathCheckpoint.load` (or the same keys).

        Parameters
        ----------
        d : dict
            ``coefs``, ``intercepts``, ``gaps``, ``converged``, ``n_active``, ``passes``,
            ``seconds``, ``rounds``; optionally ``alphas``, ``test_metrics`` (dict of metric
            name to array: ``mse``, or ``logloss`` and ``accuracy``) and ``extra``.
        l1_ratio, loss, tol
            The problem solved.
        alphas : ndarray, optional
            The alpha grid, when ``d`` has no ``alphas``; only its first ``coefs.shape[1]``
            values are kept (a partial path).
        """
        n = d["coefs"].shape[1]
        if "alphas" in d:
            a = np.asarray(d["alphas"], dtype=np.float64)
        elif alphas is not None:
            a = np.asarray(alphas, dtype=np.float64)[:n]
        else:
            raise ValueError("the alphas are neither in d nor given")
        tm = d.get("test_metrics") or {}
        return cls(
            alphas_=a,
            coefs_=d["coefs"],
            intercepts_=d["intercepts"],
            gaps_=d["gaps"],
            converged_=d["converged"],
            n_active_=d["n_active"],
            passes_=d["passes"],
            seconds_=d["seconds"],
            rounds_=d["rounds"],
            l1_ratio=l1_ratio,
            loss=loss,
            tol=tol,
            test_mse_=tm.get("mse"),
            test_logloss_=tm.get("logloss"),
            test_accuracy_=tm.get("accuracy"),
            extra_=d.get("extra"),
        )

    @property
    def n_alphas(self) -> int:
        """Number of alphas of the path."""
        return int(self.alphas_.shape[0])

    @property
    def validation_error_(self) -> np.ndarray | None:
        """The error of the loss's first validation metric (test MSE for the squared loss,
        log-loss for the logistic, error rate for the hinges), None without test data."""
        attr, _, is_score = METRIC_FIELDS[datafit_class(self.loss).metrics[0]]
        values = getattr(self, attr)
        return 1.0 - values if values is not None and is_score else values

    @property
    def best_index_(self) -> int | None:
        """Index of the alpha of least validation error (the first on ties), or None."""
        err = self.validation_error_
        if err is None or not np.isfinite(err).any():
            return None
        return int(np.argmin(np.where(np.isfinite(err), err, np.inf)))

    @property
    def best_alpha_(self) -> float | None:
        """Alpha of least validation error, None without test data."""
        k = self.best_index_
        return None if k is None else float(self.alphas_[k])

    @property
    def best_delta_(self) -> float | None:
        """Constrained paths: the delta of least validation error (None otherwise)."""
        k = self.best_index_
        return None if k is None or self.deltas_ is None else float(self.deltas_[k])

    @property
    def n_features_in_(self) -> int:
        """Features of the training data."""
        return int(self.coefs_.shape[0])

    @property
    def chosen_index_(self) -> int | None:
        """Index of the alpha used when none is given: cross-validation's choice
        (:attr:`alpha_`, when the path was cross-validated), else the alpha of least test
        error (:attr:`best_index_`); None if the path has neither."""
        if self.cv_ is not None:
            return int(self.cv_.best)
        return self.best_index_

    @property
    def alpha_(self) -> float | None:
        """Cross-validation's chosen alpha (``dl1.path(cv=...)``; None without ``cv``)."""
        return None if self.cv_ is None else float(self.alphas_[self.cv_.best])

    @property
    def alpha_1se_(self) -> float | None:
        """glmnet's one-standard-error alpha of the cross-validation (None without it)."""
        return None if self.cv_ is None else float(self.alphas_[self.cv_.best_1se])

    @property
    def chosen_alpha_(self) -> float | None:
        """The alpha of :attr:`chosen_index_` (None if the path has no chosen alpha)."""
        k = self.chosen_index_
        return None if k is None else float(self.alphas_[k])

    def index_of(self, alpha: float | None = None) -> int:
        """Index of grid alpha ``alpha`` (to relative tolerance 1e-12), or of the chosen
        alpha for None.

        Raises
        ------
        ValueError
            ``alpha`` is not on the grid (the message gives the nearest grid alphas), or is
            None on a path without a chosen alpha.
        """
        if alpha is None:
            k = self.chosen_index_
            if k is None:
                raise ValueError(
                    "this path has no chosen alpha (no test data, no cross-validation): "
                    "pass alpha= (one of alphas_) or use at(k)"
                )
            return k
        a = float(alpha)
        dist = np.abs(self.alphas_ - a)
        hits = np.flatnonzero(dist <= ALPHA_RTOL * abs(a))
        if hits.size:
            return int(hits[0])
        near = self.alphas_[np.argsort(dist, kind="stable")[:2]]
        raise ValueError(
            f"alpha={a!r} is not on the path's grid (to rtol {ALPHA_RTOL:g}); nearest: "
            + ", ".join(repr(float(x)) for x in near)
        )

    def at(self, k: int) -> Any:
        """The model of the ``k``-th alpha: a :class:`dl1.FitResult` (it predicts, scores,
        saves and converts to scikit-learn); the certificate values a path does not keep
        (absolute gap, objectives) are NaN."""
        n = self.n_alphas
        if not -n <= k < n:
            raise IndexError(f"alpha index {k} out of range for a path of {n} alphas")
        k = k % n
        nan = float("nan")
        return FitResult(
            coef_=self.coefs_[:, [k]].toarray().ravel(), intercept_=float(self.intercepts_[k]),
            gap_=float(self.gaps_[k]), dual_gap_=nan, primal_=nan, dual_=nan, p0_=nan,
            converged_=bool(self.converged_[k]), n_rounds_=int(self.rounds_[k]),
            alpha=float(self.alphas_[k]), l1_ratio=self.l1_ratio, loss=self.loss, tol=self.tol,
            n_partitions=0, passes_=float(self.passes_[k]),
            fit_intercept=True if self.fit_intercept is None else self.fit_intercept,
            n_samples_=self.n_samples_, classes_=self.classes_,
        )  # fmt: skip

    def model(self, alpha: float | None = None) -> Any:
        """The model (:class:`dl1.FitResult`) of grid alpha ``alpha``, or of the chosen
        alpha for None (see :meth:`index_of`)."""
        return self.at(self.index_of(alpha))

    def decision_function(self, X: Any, alpha: float | None = None, *, split: str = "test"):
        """``X @ coef + intercept`` of the model of ``alpha`` (None: the chosen alpha)."""
        return self.model(alpha).decision_function(X, split=split)

    def predict(self, X: Any, alpha: float | None = None, *, split: str = "test") -> Any:
        """Values or labels (``classes_``; -1 / +1 without) of the model of ``alpha`` (None:
        the chosen alpha)."""
        return self.model(alpha).predict(X, split=split)

    def predict_proba(self, X: Any, alpha: float | None = None, *, split: str = "test"):
        """Class probabilities of the logistic model of ``alpha`` (None: the chosen alpha)."""
        return self.model(alpha).predict_proba(X, split=split)

    def score(
        self,
        X: Any,
        y: Any = None,
        alpha: float | None = None,
        *,
        sample_weight: Any = None,
        split: str = "test",
    ) -> float:
        """R^2 or accuracy of the model of ``alpha`` (None: the chosen alpha); ``y=None``
        takes a store's or Dataset's targets."""
        return self.model(alpha).score(X, y, sample_weight=sample_weight, split=split)

    def to_sklearn(self, alpha: float | None = None) -> Any:
        """The scikit-learn estimator of the model of ``alpha`` (None: the chosen alpha)."""
        return self.model(alpha).to_sklearn()

    def save(self, path: Any, *, overwrite: bool = False) -> Any:
        """Write the path to the directory ``path`` (JSON and ``.npy``, no pickle), read
        back by :func:`dl1.load_model`; see :func:`dl1.saving.save_model`."""

        return save_model(self, path, overwrite=overwrite)

    def _metric_columns(self) -> list[tuple[str, np.ndarray]]:
        fields = [METRIC_FIELDS[m] for m in datafit_class(self.loss).metrics]
        return [(name, getattr(self, attr)) for attr, name, _ in fields
                if getattr(self, attr) is not None]  # fmt: skip

    def __repr__(self) -> str:
        n = self.n_alphas
        span = f"alpha {self.alphas_[0]:.3g}..{self.alphas_[-1]:.3g}, " if n else ""
        bad = np.flatnonzero(~self.converged_)
        best = "" if self.best_alpha_ is None else f", best_alpha={self.best_alpha_:.4g}"
        return (
            f"PathResult(loss={self.loss!r}, l1_ratio={self.l1_ratio}, n_alphas={n}, {span}"
            f"max_nnz={int(self.n_active_.max()) if n else 0}, "
            f"certified={n - bad.size}/{n}{best})"
        )

    def summary(self) -> str:
        """Text table: alpha, nnz, relative gap, certified, passes, seconds, test metrics.

        Non-certified alphas read ``NO`` in the certified column; the best alpha is starred.
        """
        metrics = self._metric_columns()
        best = self.best_index_
        dcol = self.deltas_ is not None
        head = (
            f"{'k':>4}"
            + (f" {'delta':>11}" if dcol else "")
            + f" {'alpha':>11} {'nnz':>8} {'rel_gap':>9} {'certified':>9} "
            f"{'passes':>8} {'seconds':>9}"
        ) + "".join(f" {name:>12}" for name, _ in metrics)
        lines = [head]
        for k in range(self.n_alphas):
            line = (
                f"{k:4d}"
                + (f" {self.deltas_[k]:11.4e}" if dcol else "")
                + f" {self.alphas_[k]:11.4e} {self.n_active_[k]:8d} {self.gaps_[k]:9.2e} "
                f"{'yes' if self.converged_[k] else 'NO':>9} {self.passes_[k]:8.2f} "
                f"{self.seconds_[k]:9.2f}"
            ) + "".join(f" {v[k]:12.6g}" for _, v in metrics)
            lines.append(line + (" *" if k == best else ""))
        n_bad = int((~self.converged_).sum())
        tail = (
            f"{self.n_alphas} alphas ({self.loss}, l1_ratio={self.l1_ratio}, tol={self.tol:g}): "
            f"{self.n_alphas - n_bad} certified, {n_bad} not; "
            f"{self.passes_.sum():.1f} passes, {self.seconds_.sum():.2f} s"
        )
        if best is not None:
            tail += f"; best alpha {self.best_alpha_:.6g} (k={best}, *)"
        lines.append(tail)
        return "\n".join(lines)

    def plot(self, directory: str | Path) -> list[Path]:
        """Write PNG figures of the path into ``directory`` (created if missing).

        Figures: ``coefficient_paths.png`` (coefficient against alpha for the features ever
        nonzero, at most the 50 of largest max |coef|), ``support_and_gap.png`` (support size,
        and relative gap on a log scale with ``tol`` and the non-certified alphas marked) and,
        with test data, ``validation.png`` (validation error against alpha, best alpha
        marked). Rendered with matplotlib's Agg canvas; no display is used.

        Returns
        -------
        list of Path
            The files written.
        """
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        files = [
            _save(self._plot_coefs(), out / "coefficient_paths.png"),
            _save(self._plot_support_gap(), out / "support_and_gap.png"),
        ]
        if self.validation_error_ is not None:
            files.append(_save(self._plot_validation(), out / "validation.png"))
        return files

    def _top_features(self) -> np.ndarray:
        C = self.coefs_
        ever, inv = np.unique(C.indices, return_inverse=True)
        if ever.size <= MAX_PATHS:
            return ever
        peak = np.zeros(ever.size)
        np.maximum.at(peak, inv, np.abs(C.data))
        return np.sort(ever[np.argsort(-peak, kind="stable")[:MAX_PATHS]])

    def _plot_coefs(self) -> Any:
        fig, ax = _figure()
        feats = self._top_features()
        paths = self.coefs_.tocsr()[feats].toarray() if feats.size else np.zeros((0, 0))
        for j, row in zip(feats, paths, strict=True):
            ax.plot(self._x, row, lw=1, marker="." if self.n_alphas < 3 else None, label=f"x{j}")
        n_ever = np.unique(self.coefs_.indices).size
        shown = f"{feats.size} of {n_ever}" if feats.size < n_ever else f"{n_ever}"
        ax.set_title(f"coefficient paths ({shown} features ever nonzero)")
        ax.set_ylabel("coefficient")
        ax.axhline(0.0, color="gray", lw=0.5)
        if 0 < feats.size <= 10:
            ax.legend(fontsize="small")
        self._alpha_axis(ax)
        return fig

    def _plot_support_gap(self) -> Any:
        fig, (ax1, ax2) = _figure(nrows=2, sharex=True, height=6.0)
        x = self._x
        ax1.plot(x, self.n_active_, "o-", ms=3)
        ax1.set_ylabel("nonzero coefficients")
        kind = "FW" if self.deltas_ is not None else "duality"
        ax1.set_title(f"support size and relative {kind} gap (tol={self.tol:g})")
        gaps = self.gaps_
        positive = np.isfinite(gaps) & (gaps > 0)
        ok, bad = self.converged_, ~self.converged_
        ax2.plot(x[ok], gaps[ok], "o", ms=3, color="tab:blue", label="certified")
        if bad.any():
            ax2.plot(x[bad], gaps[bad], "X", ms=8, color="tab:red", label="not certified")
        if positive.any() and self.tol > 0:
            ax2.set_yscale("log")
        ax2.axhline(self.tol, color="gray", ls="--", lw=0.8, label="tol")
        ax2.set_ylabel("relative gap")
        ax2.legend(fontsize="small")
        self._alpha_axis(ax2)
        return fig

    def _plot_validation(self) -> Any:
        metrics = self._metric_columns()
        fig, axes = _figure(nrows=len(metrics), sharex=True, height=3.0 + 2.0 * len(metrics))
        axes = np.atleast_1d(axes)
        which = "delta" if self.deltas_ is not None else "alpha"
        best = self.best_delta_ if self.deltas_ is not None else self.best_alpha_
        for ax, (name, v) in zip(axes, metrics, strict=True):
            ax.plot(self._x, v, "o-", ms=3)
            ax.set_ylabel(_LABELS[name])
            if best is not None:
                ax.axvline(best, color="tab:green", ls="--", lw=1, label=f"best {which} {best:.4g}")
                ax.legend(fontsize="small")
        axes[0].set_title("validation error")
        self._alpha_axis(axes[-1])
        return fig

    @property
    def _x(self) -> np.ndarray:
        return self.deltas_ if self.deltas_ is not None else self.alphas_

    def _alpha_axis(self, ax: Any) -> None:
        if self.deltas_ is not None:
            d = self.deltas_
            if d.size and np.all(np.isfinite(d) & (d > 0)):
                ax.set_xscale("log")
            ax.set_xlabel("delta (radius of the l1 ball)")
            return
        a = self.alphas_
        if a.size and np.all(np.isfinite(a) & (a > 0)):
            ax.set_xscale("log")
            lo, hi = a.min(), a.max()
            if lo == hi:
                lo, hi = lo / 2, hi * 2
            pad = (hi / lo) ** 0.03  # 3% of the log range each side: a mark at an end shows
            ax.set_xlim(hi * pad, lo / pad)  # alpha decreases to the right, as the path runs
        ax.set_xlabel("alpha")


def _figure(nrows: int = 1, sharex: bool = False, height: float = 4.5) -> Any:
    # A bare Figure on an Agg canvas: no pyplot state, no backend switch, no display needed.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows=nrows, sharex=sharex)
    return fig, axes


def _save(fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=100, format="png")
    return path


__all__ = ["PathResult"]
