"""The reliability suite: dl1 under hostile inputs, lost processes and small memory.

Every test states its pass criterion in its docstring. Cases marked ``heavy``
(multi-GiB stores, soaks, many kills) are opt-in: ``DL1_HEAVY=1 pytest
tests/reliability``; the rest run in CI.
"""

import os

import pytest

from dl1.datasets import make_e2006_like


def pytest_collection_modifyitems(config, items):
    if os.environ.get("DL1_HEAVY") == "1":
        return
    skip = pytest.mark.skip(reason="heavy reliability case; opt in with DL1_HEAVY=1")
    for item in items:
        if "heavy" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def store(tmp_path_factory):
    """The ``small`` preset (2,000 x 50,000) as a store, shared read-only by the suite's
    cluster cases; a test that damages a store writes its own."""
    path = tmp_path_factory.mktemp("reliability") / "small.zarr"
    make_e2006_like(path, preset="small", seed=3)
    return path
