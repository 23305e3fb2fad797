"""Penalties (plain picklable classes)."""

from dl1.objective.penalties.elastic_net import ElasticNet, alpha_max, soft_threshold

__all__ = ["ElasticNet", "alpha_max", "soft_threshold"]
