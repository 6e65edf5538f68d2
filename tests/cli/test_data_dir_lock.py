"""The data-dir lock of `minions up`: a second holder is refused with the first one's pid and API
URL, and a holder killed with SIGKILL leaves no stale lock behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from minions.cli.instance import DataDirLock, InstanceError
from tests.support.paths import REPO

HOLD = ("import sys, time\nfrom pathlib import Path\nfrom minions.cli.instance import DataDirLock\n"
        "lock = DataDirLock(Path(sys.argv[1]))\nlock.acquire('http://127.0.0.1:8123')\nprint('held', flush=True)\n"
        "time.sleep(600)\n")


def test_a_held_lock_names_its_holder_and_dies_with_it(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(InstanceError, match=rf"pid {holder.pid}, API http://127.0.0.1:8123"):
            DataDirLock(tmp_path).acquire("http://127.0.0.1:9000")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)

    # The kernel dropped the killed holder's lock with its descriptors: free at once.
    lock = DataDirLock(tmp_path)
    lock.acquire("http://127.0.0.1:9000")
    assert f'"pid":{os.getpid()}' in (tmp_path / "up.lock").read_text()
    lock.release()
    assert (tmp_path / "up.lock").read_text() == ""
    DataDirLock(tmp_path).acquire("http://127.0.0.1:9001")  # free again once released
