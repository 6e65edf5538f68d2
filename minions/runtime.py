"""Process runtime: uvloop where available."""

from __future__ import annotations


def install_uvloop() -> bool:
    try:
        import uvloop
    except ImportError:
        return False
    uvloop.install()
    return True
