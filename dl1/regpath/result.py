"""The result of :func:`dl1.path`, with a text summary and PNG figures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp


@dataclass
class PathResult:
    """Regularisation path.

    Attributes
    ----------
    alphas_ : ndarray (n_alphas,)
    coefs_ : scipy.sparse.csc_matrix (p, n_alphas)
    intercepts_, gaps_ (relative to P(0)), seconds_ : ndarray (n_alphas,)
    converged_ : bool ndarray; False marks an alpha whose gap did not reach ``tol``
    n_active_, rounds_ : int ndarrays
    passes_ : float ndarray, passes over the data per alpha (screened columns are skipped)
    test_mse_ (squared loss) or test_logloss_ and test_accuracy_ (logistic): validation
        error per alpha when test data was given, else None
    best_alpha_ : alpha of least validation error (None without test data)
    """

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

    @classmethod
    def from_arrays(
        cls, d: dict[str, Any], *, alphas: np.ndarray, l1_ratio: float, loss: str, tol: float
    ) -> PathResult:
        """From the dict of :meth:`dl1.regpath.PathCheckpoint.load` (or the same keys)."""
        tm = d.get("test_metrics", {})
        return cls(
            alphas_=np.asarray(alphas, dtype=np.float64)[: d["coefs"].shape[1]],
            coefs_=sp.csc_matrix(d["coefs"]),
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
        )

    @classmethod
    def from_records(cls, records: list[dict[str, Any]], **kw: Any) -> PathResult:
        """From the per-alpha records of a path run without checkpoint."""
        p = records[0]["coef"].shape[0] if records else 0
        coefs = sp.csc_matrix(
            np.column_stack([r["coef"] for r in records]) if records else np.zeros((p, 0))
        )
        names = sorted({m for r in records for m in (r["test_metric"] or {})})
        d = {
            "coefs": coefs,
            "intercepts": np.array([r["intercept"] for r in records]),
            "gaps": np.array([r["gap"] for r in records]),
            "converged": np.array([r["converged"] for r in records], dtype=bool),
            "n_active": np.array([r["n_active"] for r in records], dtype=np.int64),
            "passes": np.array([r["passes"] for r in records], dtype=np.float64),
            "seconds": np.array([r["seconds"] for r in records]),
            "rounds": np.array([r["rounds"] for r in records], dtype=np.int64),
            "test_metrics": {
                m: np.array([(r["test_metric"] or {}).get(m, np.nan) for r in records])
                for m in names
            },
        }
        return cls.from_arrays(d, **kw)

    @property
    def validation_error_(self) -> np.ndarray | None:
        return self.test_mse_ if self.loss == "squared" else self.test_logloss_

    @property
    def best_alpha_(self) -> float | None:
        err = self.validation_error_
        if err is None or not np.isfinite(err).any():
            return None
        return float(self.alphas_[int(np.nanargmin(err))])

    def __repr__(self) -> str:
        return (
            f"PathResult({self.loss}, l1_ratio={self.l1_ratio}, {len(self.alphas_)} alphas, "
            f"certified {int(self.converged_.sum())}/{len(self.alphas_)}, "
            f"best_alpha={self.best_alpha_})"
        )

    def summary(self) -> str:
        """A text table: alpha, nnz, gap, certified, passes, seconds, validation error."""
        err = self.validation_error_
        head = (
            f"{'k':>4s} {'alpha':>11s} {'nnz':>7s} {'rel.gap':>9s} {'cert':>5s} "
            f"{'passes':>6s} {'seconds':>8s}" + (f" {'val.err':>10s}" if err is not None else "")
        )
        lines = [head]
        for k, a in enumerate(self.alphas_):
            line = (
                f"{k:4d} {a:11.4e} {self.n_active_[k]:7d} {self.gaps_[k]:9.2e} "
                f"{'yes' if self.converged_[k] else 'NO':>5s} {self.passes_[k]:6.2f} "
                f"{self.seconds_[k]:8.2f}"
            )
            if err is not None:
                line += f" {err[k]:10.4g}"
            lines.append(line)
        lines.append(
            f"total {self.seconds_.sum():.2f} s, {self.passes_.sum():.1f} passes; "
            f"best alpha {self.best_alpha_}"
        )
        return "\n".join(lines)

    def plot(self, directory: str | Path) -> list[Path]:
        """Write PNG figures (coefficient paths, support and gap, validation error)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        files = []
        la = np.log10(self.alphas_)
        C = self.coefs_.tocsr()
        ever = np.flatnonzero(np.diff(C.indptr))
        if ever.size > 50:
            top = np.argsort(-abs(C[ever]).max(axis=1).toarray().ravel())[:50]
            ever = ever[top]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for j in ever:
            ax.plot(la, C[j].toarray().ravel(), lw=1)
        ax.set(
            xlabel="log10(alpha)",
            ylabel="coefficient",
            title=f"coefficient paths ({len(ever)} features shown)",
        )
        ax.invert_xaxis()
        files.append(_save(fig, out / "coefficients.png"))
        fig, ax1 = plt.subplots(figsize=(7, 4.5))
        ax1.plot(la, self.n_active_, "o-", ms=3, label="support size")
        ax1.set(xlabel="log10(alpha)", ylabel="nonzero coefficients")
        ax1.invert_xaxis()
        ax2 = ax1.twinx()
        gaps = np.maximum(self.gaps_, 1e-300)
        ax2.semilogy(la, gaps, "s", ms=3, color="tab:red", label="relative gap")
        bad = ~self.converged_
        if bad.any():
            ax2.semilogy(la[bad], gaps[bad], "x", ms=8, color="black", label="not certified")
        ax2.axhline(self.tol, color="tab:red", lw=0.8, ls="--")
        ax2.set_ylabel("relative duality gap")
        fig.legend(loc="upper left")
        files.append(_save(fig, out / "support_and_gap.png"))
        err = self.validation_error_
        if err is not None:
            fig, ax = plt.subplots(figsize=(7, 4.5))
            ax.plot(la, err, "o-", ms=3)
            if self.best_alpha_ is not None:
                ax.axvline(
                    np.log10(self.best_alpha_),
                    color="gray",
                    ls="--",
                    label=f"best alpha {self.best_alpha_:.3g}",
                )
                ax.legend()
            ax.set(
                xlabel="log10(alpha)",
                ylabel="test MSE" if self.loss == "squared" else "test log-loss",
            )
            ax.invert_xaxis()
            files.append(_save(fig, out / "validation.png"))
        return files


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
