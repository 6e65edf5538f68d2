"""Where the checkout is, for tests that run its commands from it or read its files (README.md)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
