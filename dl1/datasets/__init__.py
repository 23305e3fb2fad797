"""Synthetic data sets written as dl1 stores."""

from dl1.datasets.e2006 import make_e2006_like, true_coef
from dl1.datasets.e2006_model import (
    PRESETS,
    E2006Preset,
    column_probability,
    draws_median,
    expected_draws_per_row,
    rank_pmf,
)

__all__ = [
    "PRESETS",
    "E2006Preset",
    "column_probability",
    "draws_median",
    "expected_draws_per_row",
    "make_e2006_like",
    "rank_pmf",
    "true_coef",
]
