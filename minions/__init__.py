"""Minions: batch inference on machines that would otherwise sit idle."""

__version__ = "0.1.0"
