"""dl1: L1 / elastic-net linear models on sparse data larger than memory, on Dask."""

__version__ = "0.1.0"

# numba's cache of the kernels goes to a user cache folder, never into the installed package
# (before any kernel module is imported: numba places a kernel's cache when it is decorated).
from dl1._numba_cache import configure as _configure_numba_cache

_configure_numba_cache()

# Everything loads on first use (PEP 562): a Dask worker unpickling a task function of
# dl1.solvers imports only what the task needs, not dask.array and its optional
# integrations (pandas, xarray: 66 MiB imported in a bare process, 42 MiB less RSS per
# worker after a streamed fit).
_LAZY = {
    "ElasticNet": "dl1.estimators",
    "ElasticNetCV": "dl1.estimators",
    "HuberRegressor": "dl1.estimators",
    "Lasso": "dl1.estimators",
    "LassoCV": "dl1.estimators",
    "LinearSVC": "dl1.estimators",
    "LogisticRegression": "dl1.estimators",
    "LogisticRegressionCV": "dl1.estimators",
    "PoissonRegressor": "dl1.estimators",
    "ConvergenceWarning": "dl1.solvers.result",
    "Dataset": "dl1.dataset",
    "InsecureClusterWarning": "dl1.runtime.exposure",
    "FitResult": "dl1.solvers.result",
    "Store": "dl1.store",
    "alpha_max": "dl1.penalised",
    "delta_max": "dl1.constrained",
    "fit": "dl1.penalised",
    "fit_constrained": "dl1.constrained",
    "fit_cv": "dl1.cross_validation",
    "fit_multiclass": "dl1.multiclass",
    "from_dask": "dl1.convert",
    "from_scipy": "dl1.convert",
    "from_svmlight": "dl1.io.svmlight",
    "load_estimator": "dl1.estimators.saved",
    "load_model": "dl1.models",
    "open": "dl1.convert",
    "open_store": "dl1.store",
    "path": "dl1.penalised_path",
    "path_constrained": "dl1.constrained",
    "path_multiclass": "dl1.multiclass_path",
    "persist": "dl1.dataset",
}

__all__ = [
    "ConvergenceWarning",
    "Dataset",
    "ElasticNet",
    "ElasticNetCV",
    "FitResult",
    "HuberRegressor",
    "InsecureClusterWarning",
    "Lasso",
    "LassoCV",
    "LinearSVC",
    "LogisticRegression",
    "LogisticRegressionCV",
    "PoissonRegressor",
    "Store",
    "__version__",
    "alpha_max",
    "delta_max",
    "fit",
    "fit_constrained",
    "fit_multiclass",
    "fit_cv",
    "from_dask",
    "from_scipy",
    "load_estimator",
    "load_model",
    "open",
    "open_store",
    "path",
    "path_constrained",
    "path_multiclass",
    "persist",
]


def __getattr__(name: str):
    # local: no public `importlib` attribute on dl1, whose __dir__ lists its globals with the API
    import importlib
    import importlib.util

    if name == "datasets":
        return importlib.import_module("dl1.datasets")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if not name.startswith("_") and importlib.util.find_spec(f"dl1.{name}") is not None:
        # a subpackage reached as an attribute (``dl1.runtime.executor``): the modules an
        # eager import of the API loaded, as before (an import failing inside them is raised)
        module = importlib.import_module(f"dl1.{name}")
        for api in sorted(set(_LAZY.values())):
            importlib.import_module(api)
        return module
    raise AttributeError(f"module 'dl1' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY, "datasets"])
