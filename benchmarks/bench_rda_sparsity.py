"""Sparsity at equal test error: l1-RDA against truncated-gradient SGD (Xiao 2009, Sec. 5).

The paper's experiment, on dl1's data: L1-regularised logistic regression, one pass over
the (shuffled) training rows, for a grid of lambdas; for each method, the number of
nonzero weights and the test error rate of the last iterate. Truncated gradient with
``K = 1`` is FoBoS (the paper's Eq. (14) with ``theta = inf``): dl1's ``solver="fobos"``;
plain SGD with the L1 subgradient folded into the step is ``solver="sgd"``; RDA is
``solver="rda"`` (``rho = 0``) and enhanced RDA ``rho > 0``. Data: the ``tall`` preset's
classification variant, ``--rows`` training rows and their test split.

    python benchmarks/bench_rda_sparsity.py --rows 100000
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--ratios", type=float, nargs="+", default=[2, 5, 10, 20, 50, 100])
    args = ap.parse_args()
    import dl1
    from dl1.datasets import PRESETS, make_e2006_like
    from dl1.solvers.rda import RDASolver
    from dl1.solvers.result import ConvergenceWarning

    pr = dataclasses.replace(PRESETS["tall"], name=f"tall-{args.rows}", n_train=args.rows,
                             n_test=args.rows // 5)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        store = make_e2006_like(Path(tmp) / "tall.zarr", pr, seed=0, task="classification",
                                formats=("csc", "csr"))  # fmt: skip
        Xt = store.to_dask("test", "csr").compute()
        yt = store.read("y", "test")
        amax = dl1.alpha_max(store, loss="logistic")
        methods = {"sgd": {}, "fobos (TG, K=1)": {}, "rda": {}, "rda (rho>0)": {}}
        print(f"{'method':16} {'alpha_max/':>10} {'nonzeros':>9} {'test error':>10} {'s':>6}")
        for ratio in args.ratios:
            for name in methods:
                solver = name.split()[0]
                if "rho" in name:
                    solver = RDASolver(max_epochs=1, rho=0.005)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", ConvergenceWarning)
                    t0 = time.perf_counter()
                    res = dl1.fit(store, alpha=amax / ratio, loss="logistic", solver=solver,
                                  max_epochs=1, tol=1e-12, n_partitions=1)  # fmt: skip
                    dt = time.perf_counter() - t0
                pred = np.asarray(Xt @ res.coef_).ravel() + res.intercept_
                err = float(np.mean(np.where(pred >= 0, 1.0, -1.0) != yt))
                nnz = int(np.count_nonzero(res.coef_))
                methods[name][ratio] = (nnz, err)
                print(f"{name:16} {ratio:10g} {nnz:9d} {err:10.4f} {dt:6.1f}", flush=True)


if __name__ == "__main__":
    main()
