"""What a claim pays to read its range of a kept input (sql/schema/08_inputs.sql): `minion_kept_input` over every
subtask's range of one task, in random order, with task_inputs.data stored compressed (PostgreSQL's
default for bytea, EXTENDED: what sql/schema/08_inputs.sql keeps, the reference) and uncompressed (EXTERNAL), side by
side in one run, at the default MINIONS_INPUT_IN_DATABASE_BYTES (64 KiB) and at its most (1 MiB).

    python bench/kept_input_slices.py [--runs 5] [--records-per-subtask 10]

A compressed value is decompressed from its start up to the range asked for, at every read; an
uncompressed one is read by the TOAST chunks (2 KB) that hold the range. Each figure is the median over
the runs of the mean time per read (one prepared statement's round trip, the same in both arms), and
the bytes the value takes on disk.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")

import asyncpg  # noqa: E402

from bench.scratch import scratch_postgres  # noqa: E402
from minions.db.connect import connect  # noqa: E402
from minions.db.migrate import migrate  # noqa: E402

STORAGES = ("EXTENDED", "EXTERNAL")
SIZES = (64 * 1024, 1024 * 1024)
SUBMIT = ("SELECT id FROM minion_submit_task('bench', 'p', $1, 'sleep', 'sleep', '{}', 0, $2, NULL, NULL, 'h', "
          "NULL, $3, $4, $5, $6, $7, 0)")


def records(size: int) -> list[bytes]:
    """One-line JSONL sleep records filling at most `size` bytes."""
    lines: list[bytes] = []
    total = 0
    while True:
        line = b'{"id":"r%07d","ms":0}\n' % len(lines)
        if total + len(line) > size:
            return lines
        lines.append(line)
        total += len(line)


async def one(conn: asyncpg.Connection, name: str, size: int, per: int) -> tuple[float, int]:
    """(mean seconds per range read, bytes on disk) for a task of `size` bytes kept as the column's
    storage now says."""
    lines = records(size)
    starts, ends, firsts, counts = [], [], [], []
    offset = 0
    for first in range(0, len(lines), per):
        chunk = lines[first:first + per]
        starts.append(offset)
        offset += sum(len(line) for line in chunk)
        ends.append(offset)
        firsts.append(first)
        counts.append(len(chunk))
    task_id = await conn.fetchval(SUBMIT, name, per, starts, ends, firsts, counts, b"".join(lines))
    on_disk = await conn.fetchval("SELECT pg_column_size(data) FROM task_inputs WHERE task_id = $1", task_id)
    ranges = list(zip(starts, ends, strict=True))
    random.Random(0).shuffle(ranges)
    read = await conn.prepare("SELECT minion_kept_input($1, $2, $3)")
    started = time.perf_counter()
    for start, end in ranges:
        assert await read.fetchval(task_id, start, end) is not None
    return (time.perf_counter() - started) / len(ranges), int(on_disk)


async def main(args: argparse.Namespace) -> int:
    with scratch_postgres("minions-bench-slices-") as (server, _):
        await migrate(server.url)
        conn = await connect(server.url)
        timings: dict[tuple[str, int], list[float]] = {}
        disk: dict[tuple[str, int], int] = {}
        try:
            for run in range(args.runs):
                for storage in STORAGES:  # alternating, so both see the same moments of a noisy machine
                    await conn.execute(f"ALTER TABLE task_inputs ALTER COLUMN data SET STORAGE {storage}")
                    for size in SIZES:
                        seconds, disk[storage, size] = await one(conn, f"{storage}-{size}-{run}", size,
                                                                 args.records_per_subtask)
                        timings.setdefault((storage, size), []).append(seconds)
        finally:
            await conn.close()
    print(f"# minion_kept_input, one task's every range in random order, {args.records_per_subtask} records "
          f"a range, median of {args.runs} runs")
    print("| kept input | storage | on disk | us per read | ratio |")
    print("|---:|---|---:|---:|---|")
    for size in SIZES:
        reference = statistics.median(timings["EXTENDED", size])
        for storage in STORAGES:
            median = statistics.median(timings[storage, size])
            print(f"| {size // 1024} KiB | {storage} | {disk[storage, size]:,} B | {median * 1e6:.1f} | "
                  f"{median / reference:.2f}x EXTENDED |")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--records-per-subtask", type=int, default=10)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
