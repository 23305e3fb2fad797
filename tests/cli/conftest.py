"""Small stores and a saved model for the command-line tests, and the address of the
session's LocalCluster (commands join it with ``--scheduler``: no cluster per command)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import dl1
from tests.helpers import random_csr


@dataclass(frozen=True)
class Data:
    """A store and the matrices it was written from."""

    path: Path
    X: sp.csr_matrix
    y: np.ndarray
    X_test: sp.csr_matrix
    y_test: np.ndarray


@pytest.fixture(scope="session")
def scheduler(local_cluster) -> str:
    """The address of the session's two-worker LocalCluster."""
    return local_cluster.scheduler.address


def _data(root: Path, name: str, classification: bool, seed: int) -> Data:
    w = np.r_[np.ones(4), -np.ones(2), np.zeros(34)]
    X, Xt = random_csr(160, 40, 0.15, seed=seed), random_csr(70, 40, 0.15, seed=seed + 1)
    y, yt = X @ w + 0.05 * np.sin(np.arange(160)), Xt @ w
    if classification:
        y, yt = np.where(y >= 0.2, 1.0, -1.0), np.where(yt >= 0.2, 1.0, -1.0)
    dl1.from_scipy(X, y, root / name, X_test=Xt, y_test=yt, n_feature_blocks=2,
                   row_block_rows=40)  # fmt: skip
    return Data(root / name, X, y, Xt, yt)


@pytest.fixture(scope="module")
def reg(tmp_path_factory) -> Data:
    """A regression store: 160 x 40 train (4 row blocks), 70 x 40 test (2 row blocks)."""
    return _data(tmp_path_factory.mktemp("cli-reg"), "reg.zarr", False, 11)


@pytest.fixture(scope="module")
def clf(tmp_path_factory) -> Data:
    """A classification store (labels -1 / +1), shaped as :func:`reg`."""
    return _data(tmp_path_factory.mktemp("cli-clf"), "clf.zarr", True, 21)
