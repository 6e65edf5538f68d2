"""Memory and time of an inline POST /api/v1/tasks, on the real API process.

    python bench/inline_submit.py [--mb 60] [--runs 3] [--old REV --old-mb 10]

Each run submits a fresh task whose body is MB megabytes of sleep records ({"id":"r0000001","ms":0},
25 bytes each: the worst case for per-record overhead) and reads, from /proc/<api pid>/status, the
RSS before (after a 2 MB warm-up submission), the high-water mark after (reset before each run), and the RSS 10 s later.
Medians of the runs are printed as a Markdown table row (peak and retained growth over the baseline,
as multiples of the body too, and the request's wall time).

`--old REV` measures the API of another git revision beside this one (its tree exported with
`git archive` into a temporary folder, run with that folder first on PYTHONPATH), at `--old-mb`
(the old path needs ~140x its body: keep it small on a shared machine).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from minions import jsoncodec  # noqa: E402
from minions.embedded_pg import free_port  # noqa: E402
from minions.sdk.health import wait_until_healthy  # noqa: E402
from minions.testing.cluster import DedicatedPostgres  # noqa: E402
from minions.testing.factories import make_token  # noqa: E402

MB = 1 << 20


@dataclass
class Run:
    body: int
    seconds: float
    peak: int  # high-water mark minus baseline
    retained: int  # RSS 10 s later minus baseline


def status_bytes(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for pid {pid}")


def reset_peak(pid: int) -> None:
    """Start VmHWM afresh at the current RSS (Linux: "5" to clear_refs), so each run's peak is its own."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def sleep_body(name: str, size: int) -> bytes:
    head = jsoncodec.dumps({"team": "bench", "project": "inline", "name": name, "kind": "sleep"})[:-1]
    records = b",".join(b'{"id":"r%07d","ms":0}' % i for i in range(size // 25))
    return head + b',"input":{"records":[' + records + b"]}}"


async def post(url: str, token: str, body: bytes) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1200)) as session, session.post(
            url + "/api/v1/tasks", data=body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"}) as resp:
        if resp.status != 201:
            raise RuntimeError(f"{resp.status}: {(await resp.read())[:300]!r}")


async def measure(label: str, pythonpath: Path, database_url: str, token: str, size: int, runs: int) -> list[Run]:
    workdir = Path(tempfile.mkdtemp(prefix=f"minions-bench-inline-{label}-"))
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "MINIONS_DATABASE_URL": database_url,
           "MINIONS_STORE": (workdir / "store").as_uri(), "MINIONS_PORT": str(port),
           "MINIONS_HOST": "127.0.0.1", "MINIONS_LOG_LEVEL": "warning"}
    log = (workdir / "api.log").open("wb")
    # cwd is the tree measured: `python -m` puts it first on sys.path.
    api = subprocess.Popen([sys.executable, "-m", "minions.services.api"], env=env, cwd=pythonpath,  # noqa: ASYNC220
                           stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    results = []
    try:
        if not await wait_until_healthy(url, 60):
            raise RuntimeError(f"{label} API did not start: see {workdir / 'api.log'}")
        await post(url, token, sleep_body(f"{label}-warm", 2 * MB))
        for run in range(runs):
            body = sleep_body(f"{label}-{run}", size)
            await asyncio.sleep(2)
            baseline = status_bytes(api.pid, "VmRSS")
            reset_peak(api.pid)
            started = time.monotonic()
            await post(url, token, body)
            seconds = time.monotonic() - started
            peak = status_bytes(api.pid, "VmHWM") - baseline
            await asyncio.sleep(10)
            retained = status_bytes(api.pid, "VmRSS") - baseline
            results.append(Run(len(body), seconds, peak, retained))
            print(f"  {label} run {run + 1}: {len(body) / MB:.1f} MB body, {seconds:.1f} s, "
                  f"peak +{peak / MB:.0f} MB, retained +{retained / MB:.0f} MB", flush=True)
    finally:
        api.terminate()
        api.wait(15)
        log.close()
    return results


def row(label: str, results: list[Run]) -> str:
    body = results[0].body
    peak = statistics.median(r.peak for r in results)
    retained = statistics.median(r.retained for r in results)
    seconds = statistics.median(r.seconds for r in results)
    return (f"| {label} | {body / MB:.0f} MB | {len(results)} | +{peak / MB:.0f} MB ({peak / body:.1f}x) | "
            f"+{retained / MB:.0f} MB | {seconds:.1f} s |")


def export(rev: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="minions-bench-rev-"))
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=60)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--old", metavar="REV", help="also measure the API of this git revision")
    parser.add_argument("--old-mb", type=float, default=10)
    args = parser.parse_args()
    pg = DedicatedPostgres()
    try:
        url = await pg.start()
        import asyncpg

        conn = await asyncpg.connect(url)
        token, _ = await make_token(conn, "user", "bench")
        await conn.close()
        print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
        rows = ["| code | body | runs | peak RSS over baseline (x body) | RSS 10 s later over baseline "
                "| request time |", "|---|---:|---:|---:|---:|---:|"]
        rows.append(row("this tree", await measure("new", ROOT, url, token, int(args.mb * MB), args.runs)))
        if args.old:
            old_tree = export(args.old)
            if args.old_mb != args.mb:
                rows.append(row("this tree", await measure("new-small", ROOT, url, token,
                                                           int(args.old_mb * MB), args.runs)))
            rows.append(row(f"`{args.old}`", await measure("old", old_tree, url, token,
                                                           int(args.old_mb * MB), args.runs)))
        print("\n".join(rows))
    finally:
        pg.close()


if __name__ == "__main__":
    asyncio.run(main())
