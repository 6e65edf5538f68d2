"""The Minions executor agent: a pure HTTP client of the API's executor protocol.

It runs on macOS (MPS), Linux (CUDA or CPU) alike; the name is historical. torch and transformers
are imported lazily, only by the runners of the kinds the agent serves.
"""
