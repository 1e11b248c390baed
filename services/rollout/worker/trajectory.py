"""What a rollout function returns (the rollout-function contract's path): :class:`Trajectory`, built with
:class:`TrajectoryBuilder`. They are defined in ``services/rollout/trajectory.py``, below the worker, because a
session's calls are stitched into the same trajectories (``sessions/trajectory.py``)."""

from services.rollout.trajectory import Trajectory, TrajectoryBuilder, Turn, TurnKind

__all__ = ["Trajectory", "TrajectoryBuilder", "Turn", "TurnKind"]
