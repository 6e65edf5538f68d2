"""What complete's output check costs per MB, on the local store.

For one subtask's output of a given shape it times, side by side and alternating (the machine is
shared and noisy, so only side-by-side numbers compare), each figure the median of the rounds:

- copy:    the store streaming the output to another key (read + write, no check): the floor;
- verify:  what complete does (services/api/leasing/complete.copy_verified): the same copy, plus the
           input range read, every output line parsed for its id and compared, SHA-256 of the bytes;
- check:   OutputCheck alone on bytes in memory (the CPU part, no I/O), one thread.

    python bench/verify_output.py [--mb 32] [--rounds 5] [--shape embedding|sleep|completion]

Shapes: `embedding` lines of 384 floats (~8 KB: MiniLM), `completion` ~1 KB of text per line,
`sleep` ~30-byte lines (the worst case per byte: most lines, least payload).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minions import jsoncodec
from minions.kinds import KINDS
from minions.services.api.leasing.complete import copy_verified
from minions.services.api.leasing.output_check import OutputCheck
from minions.store.local import CHUNK_SIZE, LocalStore

MB = 1024 * 1024


def _output_line(shape: str, record_id: str, rng: random.Random) -> dict[str, Any]:
    if shape == "embedding":
        return {"id": record_id, "embedding": [rng.uniform(-1, 1) for _ in range(384)]}
    if shape == "completion":
        return {"id": record_id, "text": "lorem ipsum dolor sit amet " * 36, "usage": {"prompt_tokens": 12}}
    return {"id": record_id, "slept_ms": rng.randint(0, 1000)}


def make_objects(shape: str, megabytes: float) -> tuple[bytes, bytes, int]:
    """(input, output, records) for an output of about `megabytes`."""
    rng = random.Random(7)
    inputs, outputs, size, n = [], [], 0, 0
    while size < megabytes * MB:
        record_id = f"rec-{n:08d}"
        inputs.append(jsoncodec.dumps_line({"id": record_id, "text": "a short input text"}))
        line = jsoncodec.dumps_line(_output_line(shape, record_id, rng))
        outputs.append(line)
        size += len(line)
        n += 1
    return b"".join(inputs), b"".join(outputs), n


async def _copy(store: LocalStore, key: str) -> None:
    await store.put_stream(f"results/copy-{uuid.uuid4().hex}.jsonl", store.read(store.uri_for(key)))


async def run(shape: str, megabytes: float, rounds: int) -> dict[str, float]:
    input_bytes, output, records = make_objects(shape, megabytes)
    size_mb = len(output) / MB
    with tempfile.TemporaryDirectory() as folder:
        store = LocalStore(Path(folder))
        input_uri = await store.put_bytes("inputs/in.jsonl", input_bytes)
        token = uuid.uuid4()
        lease = {"task_id": 1, "subtask_id": 0, "attempt": 1, "records": records, "kind": shape, "input_uri": input_uri,
                 "byte_start": 0, "byte_end": len(input_bytes), "output_key": f"outputs/1/0/1-{token}.jsonl"}
        await store.put_bytes(lease["output_key"], output)
        times: dict[str, list[float]] = {"copy": [], "verify": [], "check": []}
        for _ in range(rounds):
            started = time.perf_counter()
            await _copy(store, lease["output_key"])
            times["copy"].append(time.perf_counter() - started)

            started = time.perf_counter()
            verified = await copy_verified(store, lease, token)
            times["verify"].append(time.perf_counter() - started)
            assert verified.size == len(output)

            started = time.perf_counter()
            check = OutputCheck(records, shape)
            check.add_input(input_bytes)  # every expected id up front: no I/O to interleave here
            check.input_done()
            view = memoryview(output)
            for offset in range(0, len(output), CHUNK_SIZE):
                check.add_output(bytes(view[offset:offset + CHUNK_SIZE]))
            check.finish()
            times["check"].append(time.perf_counter() - started)
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"shape={shape} output={size_mb:.1f} MB records={records} rounds={rounds} "
          f"(input {len(input_bytes) / MB:.1f} MB)")
    for name, seconds in medians.items():
        print(f"  {name:6s} {seconds * 1000:8.1f} ms  {seconds * 1000 / size_mb:6.2f} ms/MB  "
              f"{size_mb / seconds:7.1f} MB/s")
    extra = medians["verify"] - medians["copy"]
    print(f"  verify - copy: {extra * 1000 / size_mb:.2f} ms/MB")
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shape", choices=KINDS, action="append")
    args = parser.parse_args()
    for shape in args.shape or KINDS:
        asyncio.run(run(shape, args.mb, args.rounds))


if __name__ == "__main__":
    main()
