"""Regularisation paths: resumable checkpoints and results."""

from dl1.path.checkpoint import CheckpointMismatchError, PathCheckpoint
from dl1.path.result import PathResult

__all__ = ["CheckpointMismatchError", "PathCheckpoint", "PathResult"]
