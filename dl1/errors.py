"""Exceptions raised by dl1.

Every error names where the problem is (file line, split, block, array, chunk, row or
column) so that it can be fixed without guessing.
"""

from __future__ import annotations


class Dl1Error(Exception):
    """Base class of all dl1 errors."""


class ValidationError(Dl1Error, ValueError):
    """Input data is invalid (NaN/inf, bad indices, wrong lengths, unsupported dtype)."""


class SvmlightFormatError(ValidationError):
    """A line of an svmlight/libsvm file is malformed; the message names the line number."""


class StoreError(Dl1Error):
    """A dl1 store cannot be used."""


class IncompleteStoreError(StoreError):
    """The store has no complete manifest (a writer was interrupted, or it is not a dl1 store)."""


class StoreAccessError(StoreError, PermissionError):
    """The process reading a store (a worker, named) has no access to it: credentials."""


class StoreCorruptError(StoreError):
    """A chunk of the store is missing, truncated or does not match its checksum."""


class CheckpointCorruptError(StoreCorruptError):
    """A checkpoint's file names or saved arrays are malformed (length, dtype, finiteness)."""


class CheckpointLockedError(StoreError):
    """Another process is writing to the same checkpoint."""


class NumericalError(Dl1Error, FloatingPointError):
    """A solve produced non-finite values (overflow); the message names where."""


class ClusterStalledError(Dl1Error, RuntimeError):
    """The cluster made no progress for the stated time; the message says what was seen."""


class WorkerMemoryError(Dl1Error, MemoryError):
    """The workers' memory is too small for the data; the message says how much is needed."""


class MemoryStallError(ClusterStalledError, WorkerMemoryError):
    """The cluster stalled with workers paused or restarted for memory: both a stall and a
    memory error, so that either ``except`` catches it."""


class ModelFileError(Dl1Error, ValueError):
    """A saved model's files are missing, malformed or inconsistent; the message names the
    file and the field."""


class SolveCancelled(Dl1Error):
    """The solve's caller is gone (its task was cancelled): the solve stopped between two of
    its rounds rather than run on for nobody."""


class GridEdgeWarning(UserWarning):
    """Cross-validation chose an end of its grid with the held-out score still improving
    there: a better alpha (or C) may lie beyond the grid."""
