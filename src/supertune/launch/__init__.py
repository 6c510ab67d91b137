"""How processes of a run are started and how each learns its place."""

from .environment import LaunchEnvironment, launch_environment

__all__ = ["LaunchEnvironment", "launch_environment"]
