"""Real short text built on this machine: Debian's package descriptions.

``apt-cache dumpavail`` (after ``apt-get update``) lists every package the machine's
sources know, ~64k on bookworm: each stanza has a one-line ``Description``, a ``Section``
(``libs``, ``python``, ``doc``, ... with an area prefix such as ``contrib/``) and a
``Priority`` (99.5% ``optional``). The documents are short (about 6 distinct words), the
labels imbalanced: the kind of data the synthetic presets are not.

:func:`load` returns the TF-IDF matrix of the descriptions (scikit-learn's
``TfidfVectorizer``, unigrams, ``sublinear_tf``) with the sections and priorities; the
binary and multiclass labels are made from them by :func:`binary_label` and
:func:`section_classes`. Nothing is downloaded: without apt's lists the loader says how
to get them.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


@dataclass(frozen=True)
class DebianText:
    """TF-IDF rows of the package descriptions, with each package's section (area prefix
    dropped) and priority."""

    X: sp.csr_matrix
    sections: np.ndarray
    priorities: np.ndarray


def stanzas(text: str) -> list[dict[str, str]]:
    """The fields of each stanza of ``apt-cache dumpavail``'s output (continuation lines
    joined to their field)."""
    out = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = None
        for line in block.split("\n"):
            if line.startswith((" ", "\t")) and key is not None:
                fields[key] += " " + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if "Package" in fields and "Description" in fields:
            out.append(fields)
    return out


def dumpavail() -> str:
    """``apt-cache dumpavail``'s output; a clear error when apt or its lists are missing."""
    if shutil.which("apt-cache") is None:
        raise RuntimeError("apt-cache is not installed: these benchmarks need a Debian system")
    text = subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip
    if "Package:" not in text:
        raise RuntimeError("apt's package lists are empty: run `apt-get update` first")
    return text


def load(min_df: int = 2) -> DebianText:
    """The TF-IDF matrix of the descriptions (words in at least ``min_df`` of them)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    fields = stanzas(dumpavail())
    docs = [f["Description"] for f in fields]
    X = TfidfVectorizer(min_df=min_df, sublinear_tf=True).fit_transform(docs).tocsr()
    sections = np.array([f.get("Section", "").rsplit("/", 1)[-1] for f in fields])
    priorities = np.array([f.get("Priority", "") for f in fields])
    return DebianText(X.astype(np.float64), sections, priorities)


def binary_label(data: DebianText, label: str) -> np.ndarray:
    """-1 / +1 labels: ``"libs"`` (the largest section) against the rest, or
    ``"optional"`` (the priority of 99.5% of the packages) against the rest."""
    if label == "optional":
        return np.where(data.priorities == "optional", 1.0, -1.0)
    return np.where(data.sections == label, 1.0, -1.0)


def section_classes(data: DebianText, k: int | None = None) -> tuple[sp.csr_matrix, np.ndarray]:
    """Rows and section labels of a multiclass problem: every section (``k`` None), or the
    packages of the ``k`` largest sections only."""
    names, counts = np.unique(data.sections, return_counts=True)
    if k is None:
        return data.X, data.sections
    keep = np.isin(data.sections, names[np.argsort(counts)[::-1][:k]])
    return data.X[keep], data.sections[keep]
