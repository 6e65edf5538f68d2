"""Every pace figure beside its physical limit: the ratio to it, the target, and whether it was met.

A figure compared only with yesterday's hides a slow drift ("drain makespan 8.97 s vs
8.42 s" was read as a 6% change while both were 1.7-1.8x the compute they stood for). So each pace
benchmark states its limit (pure compute, the runner alone, the fastest plain script) and prints

    ratio to the limit (pure compute): 1.09x, target <= 1.10x: met

through `report`, which also appends the ratio to the ledger named by $MINIONS_BENCH_LEDGER when it is
set (`make bench` sets it). `python bench/limits.py LEDGER` prints the ledger as one table, every
ratio and its target, the misses marked; `make bench` ends with it.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

LEDGER_ENV = "MINIONS_BENCH_LEDGER"


@dataclass(frozen=True)
class Ratio:
    bench: str  # the command, short: "bench/drain.py --makespan"
    figure: str  # what was measured: "2,000 x 5 ms sleep subtasks, one agent: makespan"
    limit: str  # what it is compared with: "pure compute"
    ratio: float  # figure / limit, in the direction that `at_least` says is good
    target: float
    at_least: bool  # True: the ratio must be >= target (a speed); False: <= target (a time)
    machine: str = ""

    @property
    def met(self) -> bool:
        return self.ratio >= self.target if self.at_least else self.ratio <= self.target

    def line(self) -> str:
        sign = ">=" if self.at_least else "<="
        return (f"ratio to the limit ({self.limit}): {self.ratio:.2f}x, target {sign} {self.target:.2f}x: "
                f"{'met' if self.met else 'MISSED'}")


def report(ratio: Ratio) -> None:
    """Print the ratio's line, and add it to the ledger when $MINIONS_BENCH_LEDGER names one."""
    print(ratio.line(), flush=True)
    ledger = os.environ.get(LEDGER_ENV)
    if ledger:
        with Path(ledger).open("ab") as f:
            f.write(orjson.dumps(asdict(ratio)) + b"\n")


def read(path: Path) -> list[Ratio]:
    if not path.exists():
        return []
    return [Ratio(**orjson.loads(line)) for line in path.read_bytes().splitlines() if line.strip()]


def table(ratios: list[Ratio]) -> str:
    lines = ["| benchmark | figure | limit | ratio | target | |", "|---|---|---|---:|---:|---|"]
    for r in ratios:
        sign = ">=" if r.at_least else "<="
        lines.append(f"| {r.bench} | {r.figure} | {r.limit} | {r.ratio:.2f}x | {sign} {r.target:.2f}x | "
                     f"{'met' if r.met else '**MISSED**'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Every ratio a `make bench` run reported, with its target.")
    p.add_argument("ledger", type=Path)
    args = p.parse_args(argv)
    ratios = read(args.ledger)
    if not ratios:
        print(f"no ratios in {args.ledger}", file=sys.stderr)
        return 1
    missed = [r for r in ratios if not r.met]
    machines = sorted({r.machine for r in ratios if r.machine})
    print()
    print(f"# every pace figure against its limit ({'; '.join(machines) or 'this machine'})")
    print(table(ratios))
    print(f"{len(ratios) - len(missed)} met, {len(missed)} missed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
