"""dl1: L1 / elastic-net linear models on sparse data larger than memory, on Dask."""

__version__ = "0.1.0"

from dl1.convert import from_dask, from_scipy, open  # noqa: E402
from dl1.fit import alpha_max, fit  # noqa: E402
from dl1.pathfit import delta_max, path  # noqa: E402
from dl1.solvers.cd import ConvergenceWarning, FitResult  # noqa: E402
from dl1.store import Store, open_store  # noqa: E402

__all__ = [
    "ConvergenceWarning",
    "FitResult",
    "Store",
    "__version__",
    "alpha_max",
    "delta_max",
    "fit",
    "from_dask",
    "from_scipy",
    "open",
    "open_store",
    "path",
]


def __getattr__(name: str):
    # Submodules with heavier imports load on first use.
    if name == "datasets":
        import dl1.datasets as m

        return m
    if name == "from_svmlight":
        from dl1.io.svmlight import from_svmlight

        return from_svmlight
    raise AttributeError(f"module 'dl1' has no attribute {name!r}")
