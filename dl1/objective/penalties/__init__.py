"""Penalties (plain picklable classes)."""

from dl1.objective.penalties.elastic_net import ElasticNet, alpha_max, soft_threshold
from dl1.objective.penalties.weighted import WeightedElasticNet

__all__ = ["ElasticNet", "WeightedElasticNet", "alpha_max", "soft_threshold"]
