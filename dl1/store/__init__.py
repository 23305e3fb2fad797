"""The dl1 sparse chunked store: a zarr v3 group of compressed-sparse blocks.

See :mod:`dl1.store.format` for the layout. A store lives in a local folder or at any URL
fsspec reaches (:mod:`dl1.store.location`).
"""

__all__ = ["Location", "Store", "SplitWriter", "StoreWriter", "as_location", "open_store"]

_WHERE = {
    "Location": "dl1.store.location",
    "as_location": "dl1.store.location",
    "Store": "dl1.store.reader",
    "open_store": "dl1.store.reader",
    "SplitWriter": "dl1.store.split_writer",
    "StoreWriter": "dl1.store.writer",
}


def __getattr__(name: str):
    # loaded on first use: workers reading blocks (dl1.kernels.store) need no dask.array
    if name in _WHERE:
        # local: no public `importlib` attribute on dl1.store beside its lazy API (PEP 562)
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'dl1.store' has no attribute {name!r}")
