"""Fixtures of the objective's tests."""

from __future__ import annotations

import dask
import pytest


@pytest.fixture
def in_process():
    """Dask's synchronous scheduler: fits run in this thread, no cluster."""
    with dask.config.set(scheduler="sync"):
        yield
