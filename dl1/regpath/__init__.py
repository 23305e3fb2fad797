"""Regularisation paths: checkpoints and results (the path itself is :func:`dl1.path`)."""

from dl1.regpath.checkpoint import CheckpointMismatchError, PathCheckpoint
from dl1.regpath.result import PathResult

__all__ = ["CheckpointMismatchError", "PathCheckpoint", "PathResult"]
