"""Regularisation paths: resumable checkpoints and results."""

from dl1.regpath.checkpoint import CheckpointMismatchError, PathCheckpoint
from dl1.regpath.result import PathResult

__all__ = ["CheckpointMismatchError", "PathCheckpoint", "PathResult"]
