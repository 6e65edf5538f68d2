"""minions/runtime.py: the services and the agent run their loop on uvloop where it is installed."""

from __future__ import annotations

import asyncio

import uvloop

from minions import runtime


async def _loop_kind() -> tuple[str, int]:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop()).__module__, 7


def test_run_runs_the_coroutine_on_uvloop_and_returns_its_result() -> None:
    module, value = runtime.run(_loop_kind())
    assert module.startswith(uvloop.__name__) and value == 7
