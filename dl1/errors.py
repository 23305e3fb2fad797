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


class StoreCorruptError(StoreError):
    """A chunk of the store is missing, truncated or does not match its checksum."""
