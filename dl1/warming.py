"""Every numba kernel of dl1 compiled into numba's cache once per installation, so that the
first fit of each later process (or worker) loads them in seconds instead of compiling them
(20-60 s): ``dl1 warm``, run once after ``pip install`` and by the cluster recipes.

It runs tiny problems through each solver and loss, and the multiclass models (multinomial
and one-vs-rest, their fits and paths), in float64 and float32, and an svmlight file and a
store through ingest, in this process (no cluster): what they call is
what a fit calls. The kernels are cached beside their modules (numba's ``cache=True``, or
``NUMBA_CACHE_DIR``), where every process of the installation finds them.
"""

from __future__ import annotations

import tempfile
import time
import warnings
from pathlib import Path

import dask
import numpy as np
import scipy.sparse as sp

from dl1.constrained import fit_constrained
from dl1.convert import from_scipy
from dl1.errors import Dl1Error
from dl1.io.svmlight import from_svmlight
from dl1.multiclass import fit_multiclass
from dl1.multiclass_path import path_multiclass
from dl1.objective.datafits import LOSSES, datafit_class
from dl1.penalised import alpha_max, fit
from dl1.penalised_path import path
from dl1.runtime.warm import warm_coordinator, warm_up
from dl1.solvers.registry import SOLVERS


def _problem(dtype: type, loss: str) -> tuple[sp.csr_matrix, np.ndarray]:
    """A 60 x 40 sparse problem of ``loss``'s kind: labels -1 / +1 for a classification
    loss, else counts (a target every regression loss takes, the Poisson one included)."""
    rng = np.random.default_rng(0)
    X = sp.random(60, 40, density=0.3, random_state=0, format="csr", dtype=dtype)
    z = X @ rng.standard_normal(40)
    if datafit_class(loss).classifies:
        return X, np.where(z > np.median(z), 1.0, -1.0)
    return X, rng.poisson(np.exp(np.clip(z, -2, 2))).astype(np.float64)


#: The multiclass models a fit can ask for: (multi_class, loss, penalty).
MULTICLASS_MODELS = (
    ("multinomial", "logistic", "l1"),
    ("multinomial", "logistic", "grouped"),
    *(("ovr", loss, "l1") for loss in ("logistic", "squared_hinge", "hinge")),
)


def warm_multiclass(dtype: type) -> None:
    """The multiclass kernels (:mod:`dl1.kernels.multiclass`: the shared pass ``X^T
    Theta``, the softmax, the block-coordinate epochs, the grouped prox, the intercepts'
    Newton steps and line search; the one-vs-rest scans and subproblems): a 3-class problem
    through every scheme, loss and penalty of :func:`dl1.fit_multiclass`, the elastic net
    too, and a short multinomial path (its warm starts), in ``dtype``."""
    X, _ = _problem(dtype, "squared")
    z = X @ np.random.default_rng(1).standard_normal(X.shape[1])
    y = np.argsort(np.argsort(z)) * 3 // X.shape[0]  # three classes of 20 samples
    for multi_class, loss, penalty in MULTICLASS_MODELS:
        for l1_ratio in (1.0, 0.5)[: 1 if loss == "hinge" else 2]:
            fit_multiclass(X, y, alpha=0.02, l1_ratio=l1_ratio, multi_class=multi_class,
                           loss=loss, penalty=penalty, tol=1e-4, max_rounds=5,
                           client=None)  # fmt: skip
    for penalty in ("l1", "grouped"):
        path_multiclass(X, y, n_alphas=3, eps=0.1, penalty=penalty, tol=1e-3, max_rounds=5,
                        client=None)  # fmt: skip


def warm_all() -> dict[str, float]:
    """Compile (or load) every kernel: returns the seconds each stage took."""
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    warm_up()
    warm_coordinator()
    seconds["working set"] = time.perf_counter() - t0
    with dask.config.set(scheduler="sync"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tiny problems, few rounds: convergence warnings
        for dtype in (np.float64, np.float32):
            for loss in LOSSES:
                t0 = time.perf_counter()
                X, y = _problem(dtype, loss)
                alpha = 0.1 * alpha_max(X, y, loss=loss, client=None)
                for name in SOLVERS:
                    try:  # a solver that does not fit this loss refuses it up front
                        fit(X, y, alpha=alpha, loss=loss, solver=name, tol=1e-3,
                            max_rounds=3, client=None)  # fmt: skip
                    except Dl1Error:
                        pass
                try:
                    path(X, y, loss=loss, n_alphas=3, tol=1e-3, client=None, solver="auto")
                except Dl1Error:
                    pass
                try:
                    fit_constrained(X, y, delta=1.0, loss=loss, max_iter=5, client=None)
                except ValueError:  # Frank-Wolfe takes the squared and logistic losses
                    pass
                key = f"{loss} ({np.dtype(dtype).name})"
                seconds[key] = time.perf_counter() - t0
        t0 = time.perf_counter()
        for dtype in (np.float64, np.float32):  # working sets past the tiny ones' kernels
            X = sp.random(2000, 5000, density=0.01, random_state=1, format="csr", dtype=dtype)
            y = X[:, :20] @ np.arange(1.0, 21.0)
            fit(X, np.asarray(y).ravel(), alpha=0.01, client=None)
        seconds["larger working sets"] = time.perf_counter() - t0
        for dtype in (np.float64, np.float32):
            t0 = time.perf_counter()
            warm_multiclass(dtype)
            seconds[f"multiclass ({np.dtype(dtype).name})"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="dl1-warm-") as tmp:
            X, y = _problem(np.float64, "squared")
            text = "".join(
                f"{y[i]:.6g} " + " ".join(f"{j + 1}:{v:.6g}" for j, v in zip(
                    X.indices[X.indptr[i]:X.indptr[i + 1]],
                    X.data[X.indptr[i]:X.indptr[i + 1]], strict=True)) + "\n"
                for i in range(X.shape[0])
            )  # fmt: skip
            (Path(tmp) / "a.svm").write_text(text)
            from_svmlight(Path(tmp) / "a.svm", Path(tmp) / "a.zarr")
            from_scipy(X, y, Path(tmp) / "b.zarr", n_feature_blocks=2)
        seconds["ingest"] = time.perf_counter() - t0
    return seconds
