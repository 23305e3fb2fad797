"""Quick start: synthetic E2006-like data -> store -> certified Lasso on a LocalCluster.

python examples/quickstart.py [STORE_DIR]
"""

import sys
import tempfile
from pathlib import Path

import numpy as np
from distributed import Client, LocalCluster

import dl1
from dl1.datasets import make_e2006_like
from dl1.predict import decision_function


def main(out: Path) -> None:
    store = make_e2006_like(out / "small.zarr", preset="small", seed=0)
    print(store)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as client,
    ):
        amax = dl1.alpha_max(store, client=client)
        for ratio in (5, 20, 50):
            res = dl1.fit(store, alpha=amax / ratio, tol=1e-6, client=client)
            pred = client.compute(decision_function(store, res.coef_, res.intercept_)).result()
            mse = np.mean((store.read("y", "test") - pred) ** 2)
            print(
                f"alpha_max/{ratio:<3d} nnz {np.count_nonzero(res.coef_):5d}  "
                f"gap {res.gap_:.1e} (certified: {res.converged_})  test MSE {mse:.4f}"
            )


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:  # used when no folder is given
        main(Path(sys.argv[1] if len(sys.argv) > 1 else tmp))
