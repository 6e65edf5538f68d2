"""The Python SDK: an async client of the user API."""

from minions.sdk.client import MinionsClient, MinionsError

__all__ = ["MinionsClient", "MinionsError"]
