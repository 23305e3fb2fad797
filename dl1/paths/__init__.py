"""Regularisation paths: resumable checkpoints and results."""

from dl1.paths.checkpoint import PathCheckpoint
from dl1.paths.checkpoint_format import CheckpointMismatchError
from dl1.paths.result import PathResult

__all__ = ["CheckpointMismatchError", "PathCheckpoint", "PathResult"]
