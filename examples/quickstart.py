"""dl1 on a local Dask cluster, out of core, in under a minute: python examples/quickstart.py
(it writes e2006.zarr, lasso-fit and lasso-cv in the current folder)."""

from distributed import Client, LocalCluster

import dl1
from dl1.datasets import make_e2006_like

if __name__ == "__main__":  # the workers are processes that import this script
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address="127.0.0.1:0")
    with cluster, Client(cluster):  # the current client: dl1 runs on it (or pass client=)
        store = make_e2006_like("e2006.zarr", preset="small", overwrite=True)  # 2,000 x 50,000
        res = dl1.fit(store, alpha=dl1.alpha_max(store) / 20, tol=1e-6)  # gap <= tol * P(0)
        print("gap", res.gap_, "converged", res.converged_, "test R^2", res.score(store))
        path = dl1.path(store, n_alphas=20, tol=1e-6, X_test="test")  # each alpha certified
        print(path.summary())
        with dl1.persist(store) as data:  # a data handle: blocks read once, kept by workers
            cv = dl1.LassoCV(cv=5, alphas=20, eps=1e-2, tol=1e-6).fit(data)  # a path per fold
        print("CV alpha", cv.alpha_, "1-SE alpha", cv.alpha_1se_, "test R^2", cv.score(store))
        res.save("lasso-fit", overwrite=True)  # JSON and .npy files, no pickle
        print(dl1.load_model("lasso-fit").to_sklearn())  # a scikit-learn Lasso
        cv.save("lasso-cv", overwrite=True)  # dl1.load_estimator: the fitted LassoCV again
        print(dl1.load_estimator("lasso-cv").predict(store)[:3].compute())  # a dask array
