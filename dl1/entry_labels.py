"""The labels an entry point was given (or that its data carries) mapped to -1 / +1 before
any work (:mod:`dl1.labels`), for :func:`dl1.fit`, :func:`dl1.path`, :func:`dl1.alpha_max`,
:func:`dl1.fit_cv` and the CLI."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from dl1.dataset import Dataset
from dl1.labels import PM1, as_pm1, encode_labels
from dl1.objective.datafits import datafit_class
from dl1.paths.evaluation import test_data
from dl1.runtime.compute import computed
from dl1.store import Store, open_store
from dl1.store.location import is_store_source


@dataclasses.dataclass(frozen=True)
class EntryLabels:
    """An entry point's data with its labels as the datafits read them: ``X`` (a
    :class:`~dl1.dataset.Dataset` whose own labels were mapped: a view of it holding the
    mapped ones), ``y`` (None: X's own labels, already -1 / +1) and the original two values
    (None: no labels to map, a regression loss or no labels at all)."""

    X: Any
    y: Any
    classes: np.ndarray | None

    @property
    def mapped(self) -> bool:
        """Whether the labels were other than -1 / +1."""
        return self.classes is not None and not np.array_equal(self.classes, PM1)


def stored_labels(X: Any, split: str) -> np.ndarray | None:
    """The labels ``X`` carries: a store's (or store path's) ``y`` of ``split``, a
    Dataset's (its view's rows); None for other data."""
    if isinstance(X, Dataset):
        return X.y
    if is_store_source(X):
        X = open_store(X)
    if isinstance(X, Store):
        return np.asarray(X.read("y", split))
    return None


def entry_labels(X: Any, y: Any, loss: Any, split: str) -> EntryLabels:
    """An entry point's ``X`` and ``y`` with the labels of a classification ``loss`` mapped
    to -1 / +1 (:func:`encode_labels`; ``y`` None: those stored with X), before any work.

    Labels given are passed on mapped; labels stored with X are passed on as ``y`` when they
    were mapped (a :class:`~dl1.dataset.Dataset`: a view holding them, :func:`relabelled`),
    else left to be read as before. Other losses, and no labels at all (refused by the entry
    point), leave ``X`` and ``y`` as they are.
    """
    if not datafit_class(loss).classifies:
        return EntryLabels(X, y, None)
    given = y if y is not None else stored_labels(X, split)
    if given is None:
        return EntryLabels(X, y, None)
    if hasattr(given, "compute"):  # a dask array: computed where a solve here computes
        (given,) = computed(given, what="y")
    enc = encode_labels(given, datafit_class(loss).name)
    if y is not None:
        return EntryLabels(X, enc.y, enc.classes)
    if np.array_equal(enc.classes, PM1):
        return EntryLabels(X, None, enc.classes)

    if isinstance(X, Dataset):
        return EntryLabels(relabelled(X, enc.classes), None, enc.classes)
    return EntryLabels(X, enc.y, enc.classes)


def relabelled(ds: Any, classes: np.ndarray) -> Any:
    """The :class:`~dl1.dataset.Dataset` ``ds`` (a view of the same rows, sharing its blocks
    and its lifetime, as ``ds[rows]`` does) with its labels mapped by ``classes``; a view's
    other rows (weighed 0 by its fits) get -1."""

    held = ds._inputs
    if ds.rows is None:
        y = as_pm1(held.y, classes)
    else:
        y = np.full(ds.n_total, -1.0)
        y[ds.rows] = as_pm1(held.y[ds.rows], classes)
    view = Dataset(dataclasses.replace(held, y=y), ds._blocks, ds.col_bounds, ds.client,
                   ds.n_partitions, ds.rows)  # fmt: skip
    view._shared = ds._shared
    return view


def held_out(X: Any, X_test: Any, y_test: Any, labels: EntryLabels) -> tuple[Any, Any]:
    """A path's held-out data ``(X_test, y_test)``, its labels mapped as the training
    labels were (a store's split named by ``X_test``: read here, as the path reads it);
    unchanged when they were not mapped. A label of neither class is refused."""
    if X_test is None or not labels.mapped:
        return X_test, y_test
    if hasattr(y_test, "compute"):  # a dask array: computed where a solve here computes
        (y_test,) = computed(y_test, what="y_test")
    X_test, y_test = test_data(X, X_test, y_test)
    return X_test, as_pm1(y_test, labels.classes, "y_test")


__all__ = ["EntryLabels", "entry_labels", "held_out", "relabelled", "stored_labels"]
