"""`minions --help` start-up time: the command a user types first, and what every shell completion
and typo pays. Runs `minions --help` (and, for scale, a bare interpreter) N times; medians in ms.

    python bench/cli_help.py [--minions PATH] [--runs 30]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def timings(command: list[str], runs: int) -> list[float]:
    found = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        found.append((time.perf_counter() - start) * 1000)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minions", default=shutil.which("minions") or "",
                        help="the minions executable (default: the one on PATH)")
    parser.add_argument("--runs", type=int, default=30, help="runs of each command (default 30)")
    args = parser.parse_args()
    minions = args.minions or f"{sys.executable} -m minions.cli.main"
    python = str(Path(minions).with_name("python")) if args.minions else sys.executable
    for label, command in (("python -c pass", [python, "-c", "pass"]),
                           ("minions --help", [*minions.split(), "--help"]),
                           ("minions status --help", [*minions.split(), "status", "--help"])):
        ms = timings(command, args.runs)
        print(f"{label:24} median {statistics.median(ms):7.1f} ms   min {min(ms):7.1f}   max {max(ms):7.1f}"
              f"   ({args.runs} runs)")


if __name__ == "__main__":
    main()
