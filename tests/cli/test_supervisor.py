"""minions up's supervisor: restarts a child that dies, never one that is being stopped."""

from __future__ import annotations

import asyncio
from pathlib import Path

from minions.cli.supervisor import Supervisor


async def test_a_dead_child_is_restarted(tmp_path: Path) -> None:
    supervisor = Supervisor(tmp_path)
    child = await supervisor.start("zen", "this", [], {})  # `python -m this` prints and exits at once
    for _ in range(50):
        if (child.restarts >= 1 and child.process and child.process.returncode is None) or child.restarts >= 2:
            break
        await asyncio.sleep(0.1)
    assert child.restarts >= 1
    await supervisor.stop()


async def test_a_child_stopped_while_it_waits_to_restart_stays_stopped(tmp_path: Path) -> None:
    supervisor = Supervisor(tmp_path)
    child = await supervisor.start("zen", "this", [], {})
    assert child.process is not None
    await child.process.wait()
    await asyncio.sleep(0.2)  # its watcher now waits (1 s) to restart it
    await supervisor.stop_children(["zen"])
    first = child.process
    await asyncio.sleep(1.5)
    assert child.process is first, "the supervisor restarted a child it had been told to stop"
    await supervisor.stop()
