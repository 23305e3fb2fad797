"""The dl1 sparse chunked store: a zarr v3 group of compressed-sparse blocks.

See :mod:`dl1.store.format` for the layout.
"""

from dl1.store.reader import Store, open_store
from dl1.store.writer import SplitWriter, StoreWriter

__all__ = ["Store", "SplitWriter", "StoreWriter", "open_store"]
