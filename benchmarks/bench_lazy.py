"""Lazy against dense elastic-net updates per example (Lipton & Elkan 2015, Table 1).

Rows of the ``tall`` preset (260,941 features, ~88 nonzeros per row: the paper's Medline
shape) in CSR; one pass of logistic-loss elastic-net SGD and FoBoS with a decaying rate,
timed per example:

* lazy: :func:`dl1.kernels.lazy.lazy_pass` (O(nnz) per example);
* dense: :func:`dl1.kernels.lazy.dense_pass`, the same steps with the regularisation applied
  to every weight at every step (O(d) per example; timed on fewer rows);
* peer: scikit-learn's ``SGDClassifier(loss="log_loss", penalty="elasticnet")``, one
  ``partial_fit`` epoch over the same rows (its own lazy scheme: a weight scale for the
  ridge part, Tsuruoka et al.'s cumulative L1 penalty).

The lazy and dense passes start from the same weights and are checked to agree on the rows
both ran (max |difference| reported). Every figure is the median of ``--repeat`` runs,
each in the same process after a warm-up (numba compilation excluded); peak RSS is this
process's.

    python benchmarks/bench_lazy.py --rows 20000 --dense-rows 200 --repeat 5
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import numpy as np


def _peak_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def rows_of_tall(n_rows: int, root: Path):
    """CSR rows (and +-1 labels) of the tall preset, ``n_rows`` of them."""
    import scipy.sparse as sp

    from dl1.datasets import PRESETS, make_e2006_like

    pr = dataclasses.replace(PRESETS["tall"], name=f"tall-{n_rows}", n_train=n_rows, n_test=0)
    store = make_e2006_like(root / "tall.zarr", pr, seed=0, task="classification",
                            formats=("csr",))  # fmt: skip
    X = store.to_dask("train", "csr").compute()
    X = sp.csr_matrix(X)
    X.sort_indices()
    return X, store.read("y", "train")


def time_pass(kernel, X, y, rows, eta, form, l1, l2, repeat):
    from dl1.kernels.codes import LOGISTIC
    from dl1.kernels.lazy import FORM_CODES

    sw = np.ones(X.shape[0])
    times, w = [], None
    for _ in range(repeat):
        w = np.zeros(X.shape[1])
        t0 = time.perf_counter()
        kernel(X.indptr, X.indices, X.data, y, sw, rows, eta, w, 0.0, True, l1, l2,
               FORM_CODES[form], LOGISTIC, 1.0)  # fmt: skip
        times.append((time.perf_counter() - t0) / rows.shape[0])
    return float(np.median(times)), w


def time_sklearn(X, y, alpha, l1_ratio, repeat):
    from sklearn.linear_model import SGDClassifier

    times = []
    for _ in range(repeat):
        clf = SGDClassifier(loss="log_loss", penalty="elasticnet", alpha=alpha,
                            l1_ratio=l1_ratio, learning_rate="invscaling", eta0=0.1,
                            power_t=0.5, shuffle=False, random_state=0)  # fmt: skip
        t0 = time.perf_counter()
        clf.partial_fit(X, y, classes=np.array([-1.0, 1.0]))
        times.append((time.perf_counter() - t0) / X.shape[0])
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--dense-rows", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    from dl1.kernels.lazy import dense_pass, lazy_pass

    with tempfile.TemporaryDirectory() as tmp:
        X, y = rows_of_tall(args.rows, Path(tmp))
    n, d = X.shape
    print(f"tall rows: {n:,} x {d:,}, {X.nnz / n:.1f} nonzeros per row")
    alpha, l1_ratio = 1e-5, 0.5
    l1, l2 = alpha * l1_ratio, alpha * (1 - l1_ratio)
    rows = np.arange(n, dtype=np.int64)
    eta = 0.1 / np.sqrt(1.0 + np.arange(n))
    few = rows[: args.dense_rows]
    # warm-up: compile both kernels
    time_pass(lazy_pass, X, y, few[:2], eta[:2], "sgd", l1, l2, 1)
    time_pass(dense_pass, X, y, few[:2], eta[:2], "sgd", l1, l2, 1)
    time_pass(lazy_pass, X, y, few[:2], eta[:2], "fobos", l1, l2, 1)
    time_pass(dense_pass, X, y, few[:2], eta[:2], "fobos", l1, l2, 1)
    print(f"{'form':6} {'lazy us/ex':>11} {'dense us/ex':>12} {'dense/lazy':>10} {'max |dw|':>9}")
    for form in ("sgd", "fobos"):
        lazy_t, _ = time_pass(lazy_pass, X, y, rows, eta, form, l1, l2, args.repeat)
        _, w_lazy_few = time_pass(lazy_pass, X, y, few, eta, form, l1, l2, 1)
        dense_t, w_dense_few = time_pass(dense_pass, X, y, few, eta, form, l1, l2, args.repeat)
        diff = float(np.abs(w_lazy_few - w_dense_few).max())
        print(f"{form:6} {lazy_t * 1e6:11.2f} {dense_t * 1e6:12.1f} {dense_t / lazy_t:10.0f} "
              f"{diff:9.1e}")  # fmt: skip
    sk = time_sklearn(X, y, alpha, l1_ratio, args.repeat)
    print(f"scikit-learn SGDClassifier(elasticnet), one partial_fit epoch: {sk * 1e6:.2f} us/ex")
    print(f"peak RSS {_peak_mb():.0f} MB")


if __name__ == "__main__":
    main()
