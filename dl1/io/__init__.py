"""Reading external formats into dl1 stores."""

from dl1.io.svmlight import from_svmlight, write_svmlight_split

__all__ = ["from_svmlight", "write_svmlight_split"]
