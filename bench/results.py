"""Results of a big task on S3, before and after compaction, in one run.

Against moto's S3 server (the tests' S3, /work/shared/ENV.md) and an embedded PostgreSQL, it seeds a
completed `sleep` task of N subtasks whose verified results are real objects in the bucket (one per
subtask, the layout complete writes), then times, each the median of --rounds:

- before:    the JSONL results stream as it was: one store GET per subtask, in order (read-ahead 1);
- readahead: the same stream reading 16 results ahead (today's path for a task not compacted yet,
             and for ?partial=true of a running task);
- compact:   the watchdog's compaction into parts (once: it is a one-off per task);
- after:     the SDK fetching the parts by presigned GET straight from S3, each checked;
- stream:    the JSONL stream served from the parts by the API.

Every arm's bytes are checked equal. The seeding writes the task's rows directly (as
minions.testing.factories does): the executor protocol is not what is measured.

    python bench/results.py [--subtasks 10000] [--records 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

for _name, _value in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                      "AWS_EC2_METADATA_DISABLED": "true", "AWS_DEFAULT_REGION": "us-east-1"}.items():
    os.environ[_name] = _value

import aiohttp  # noqa: E402
import boto3  # noqa: E402
from aiohttp import web  # noqa: E402

from minions import jsoncodec  # noqa: E402
from minions.config import Settings  # noqa: E402
from minions.db.connect import connect  # noqa: E402
from minions.db.migrate import migrate  # noqa: E402
from minions.embedded_pg import EmbeddedPostgres, free_port  # noqa: E402
from minions.logging import configure as configure_logging  # noqa: E402
from minions.result_parts import Compactor  # noqa: E402
from minions.sdk import MinionsClient  # noqa: E402
from minions.services.api.app import create_app  # noqa: E402
from minions.services.api.results import reading as result_reading  # noqa: E402
from minions.store.s3 import S3Store  # noqa: E402
from minions.testing.factories import make_task, make_token  # noqa: E402

BUCKET = "bench-results"
SEED_CONCURRENCY = 64

# Bench seeding only: the rows complete would have left, for results already in the bucket.
SEED_DONE = """
UPDATE subtasks s SET state = 'done', done_at = now(), output_key = v.key, result_key = v.key,
       result_sha256 = v.sha, result_bytes = v.size
  FROM unnest($2::integer[], $3::text[], $4::bytea[], $5::bigint[]) AS v(id, key, sha, size)
 WHERE s.task_id = $1 AND s.subtask_id = v.id"""
SEED_COMPLETED = "UPDATE tasks SET status = 'completed', open_subtasks = 0, finished_at = now() WHERE id = $1"


async def seed(url: str, store: S3Store, subtasks: int, records: int) -> tuple[int, int]:
    """A completed task of `subtasks` done subtasks; (its id, result bytes)."""
    conn = await connect(url)
    try:
        task_id = await make_task(conn, name="big", subtasks=subtasks, records_per_subtask=records)
        keys, shas, sizes = [], [], []
        sem = asyncio.Semaphore(SEED_CONCURRENCY)

        async def put(i: int) -> None:
            body = b"".join(jsoncodec.dumps_line({"id": f"r{i:06d}-{j:03d}", "slept_ms": j}) for j in range(records))
            key = f"results/{task_id}/{i}/1-00000000-0000-0000-0000-000000000000-{i:016x}.jsonl"
            async with sem:
                await store.put_bytes(key, body)
            keys[i], shas[i], sizes[i] = key, hashlib.sha256(body).digest(), len(body)

        keys, shas, sizes = [""] * subtasks, [b""] * subtasks, [0] * subtasks
        await asyncio.gather(*(put(i) for i in range(subtasks)))
        await conn.execute(SEED_DONE, task_id, list(range(subtasks)), keys, shas, sizes)
        await conn.execute(SEED_COMPLETED, task_id)
        return task_id, sum(sizes)
    finally:
        await conn.close()


async def timed(fn: Callable[[], Awaitable[bytes]]) -> tuple[float, bytes]:
    start = time.perf_counter()
    data = await fn()
    return time.perf_counter() - start, data


async def run(args: argparse.Namespace, url: str, endpoint: str) -> None:
    configure_logging("bench", level="warning")
    await migrate(url)
    store = S3Store(f"s3://{BUCKET}/minions", endpoint)
    t0 = time.perf_counter()
    task_id, total = await seed(url, store, args.subtasks, args.records)
    print(f"# seeded {args.subtasks:,} subtasks ({args.subtasks * args.records:,} records, {total:,} bytes) "
          f"in {time.perf_counter() - t0:.1f} s")
    conn = await connect(url)
    admin, _ = await make_token(conn, "admin")
    port = free_port()
    settings = Settings(database_url=url, store=f"s3://{BUCKET}/minions", s3_endpoint_url=endpoint,
                        host="127.0.0.1", port=port)
    runner = web.AppRunner(create_app(settings))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    client = MinionsClient(f"http://127.0.0.1:{port}", admin, timeout_s=600)
    results_url = f"http://127.0.0.1:{port}/api/v1/tasks/search/ranker/big/results"

    async def stream() -> bytes:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {admin}"}) as session, \
                session.get(results_url, timeout=aiohttp.ClientTimeout(total=None)) as resp:
            assert resp.status == 200
            return await resp.read()

    async def sdk() -> bytes:
        return b"".join([chunk async for chunk in client.results("search", "ranker", "big")])

    times: dict[str, list[float]] = {"before": [], "readahead": []}
    reference = b""
    try:
        for _ in range(args.rounds):
            for arm, ahead in (("before", 1), ("readahead", 16)):
                result_reading.RESULT_READ_AHEAD = ahead
                seconds, data = await timed(stream)
                reference = reference or data
                assert data == reference and data.count(b"\n") == args.subtasks * args.records, arm
                times[arm].append(seconds)
        start = time.perf_counter()
        compaction = await Compactor(conn, store, part_bytes=settings.result_part_bytes).compact(task_id)
        compact_s = time.perf_counter() - start
        assert compaction.done
        times["after"], times["stream"] = [], []
        for _ in range(args.rounds):
            for arm, fn in (("after", sdk), ("stream", stream)):
                seconds, data = await timed(fn)
                assert data == reference, arm
                times[arm].append(seconds)
    finally:
        await client.close()
        await runner.cleanup()
        await store.close()
        await conn.close()
    before = statistics.median(times["before"])
    print(f"# {args.subtasks:,} subtasks of {args.records} records; medians of {args.rounds}; "
          f"{compaction.parts} part(s) of <= {settings.result_part_bytes:,} bytes")
    print(f"{'arm':<10} {'median s':>9} {'subtasks/s':>11} {'vs before':>9}")
    for arm in ("before", "readahead", "after", "stream"):
        median = statistics.median(times[arm])
        print(f"{arm:<10} {median:>9.2f} {args.subtasks / median:>11,.0f} {before / median:>8.1f}x")
    print(f"{'compact':<10} {compact_s:>9.2f} {args.subtasks / compact_s:>11,.0f}   (once per task)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--subtasks", type=int, default=10_000)
    p.add_argument("--records", type=int, default=20, help="records per subtask")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="minions-bench-results-"))
    server = EmbeddedPostgres(root / "pgdata", fast=True)
    # moto in a process of its own, as a real S3 would be: in a thread of ours it would share our GIL.
    port = free_port()
    moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        endpoint = f"http://127.0.0.1:{port}"
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        for _ in range(100):
            try:
                s3.create_bucket(Bucket=BUCKET)
                break
            except Exception:  # not listening yet
                time.sleep(0.1)
        server.start()
        asyncio.run(run(args, server.url, endpoint))
    finally:
        server.stop()
        moto.terminate()
        moto.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
