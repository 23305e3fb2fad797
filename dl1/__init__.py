"""dl1: L1 / elastic-net linear models on sparse data larger than memory, on Dask."""

__version__ = "0.1.0"
