"""Synthetic data sets written as dl1 stores."""

from dl1.datasets.e2006 import (
    PRESETS,
    E2006Preset,
    column_probability,
    draws_median,
    expected_draws_per_row,
    make_e2006_like,
    rank_pmf,
    true_coef,
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
