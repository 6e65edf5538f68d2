"""The backoff of `minions up`'s supervisor is for crash loops. A child that ran
healthily for a while and then died is restarted at once, not after the longest delay an earlier
crash loop reached. A real child process keeps its own record of when it started and ended."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from minions.cli.supervisor import Supervisor

CRASHES = 5  # quick deaths: the delay climbs 0.25, 0.5, 1, 2, 3 (capped)
MAX_RESTART_S = 3.0
HEALTHY_S = 1.5

# Run N (0-based, counted in a file): the first CRASHES die at once; the next runs healthily for longer
# than HEALTHY_S, then dies; the last stays up. Each run logs "start <t>" and "end <t>" (wall clock,
# the same clock in both processes).
CHILD = f'''
import pathlib, sys, time
log = pathlib.Path(sys.argv[1])
runs = log.read_text().count("start") if log.exists() else 0
with log.open("a") as f:
    f.write(f"start {{time.time()}}\\n")
if runs < {CRASHES}:
    code = 1
elif runs == {CRASHES}:
    time.sleep({HEALTHY_S} + 0.5)
    code = 2
else:
    time.sleep(3600)
with log.open("a") as f:
    f.write(f"end {{time.time()}}\\n")
sys.exit(code)
'''


async def test_a_crash_after_a_healthy_run_restarts_at_once(tmp_path: Path) -> None:
    (tmp_path / "flaky_child.py").write_text(CHILD)
    runs = tmp_path / "runs.log"
    supervisor = Supervisor(tmp_path / "logs", first_restart_s=0.25, max_restart_s=MAX_RESTART_S,
                            healthy_s=HEALTHY_S)
    await supervisor.start("flaky", "flaky_child", [str(runs)], {"PYTHONPATH": str(tmp_path)})
    try:
        deadline = time.monotonic() + 90
        while (runs.read_text().count("start") if runs.exists() else 0) < CRASHES + 2:
            assert time.monotonic() < deadline, f"the child was not restarted in time:\n{runs.read_text()}"
            await asyncio.sleep(0.05)
    finally:
        await supervisor.stop()
    events = [line.split() for line in runs.read_text().splitlines()]
    starts = [float(t) for kind, t in events if kind == "start"]
    ends = [float(t) for kind, t in events if kind == "end"]
    # The crash loop backed off (the delays grew to the cap) ...
    assert starts[CRASHES] - ends[CRASHES - 1] >= MAX_RESTART_S * 0.9
    # ... and the crash after a healthy run was restarted at once, not after that cap: the gap is
    # the time to start a Python process, far under the 3 s the old backoff kept.
    assert starts[CRASHES] + HEALTHY_S <= ends[CRASHES]
    gap = starts[CRASHES + 1] - ends[CRASHES]
    assert gap < MAX_RESTART_S / 2, f"restarted {gap:.2f} s after a crash that followed a healthy run"
