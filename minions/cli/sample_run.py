"""The sample job of `make run`: a few hundred sentences embedded by the local agent, with progress,
then a few result lines."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from minions import jsoncodec
from minions.cli.tasks import wait_with_progress
from minions.sample import embedding_records
from minions.sdk import MinionsClient

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


async def run_sample(api_url: str, token: str, data_dir: Path, count: int) -> int:
    name = time.strftime("sample-%Y%m%d-%H%M%S")
    async with MinionsClient(api_url, token) as client:
        await _local_agent_ready(client)
        task = await client.submit({
            "team": "demo", "project": "sample", "name": name, "kind": "embedding", "model": MODEL,
            "input": {"records": embedding_records(count)}, "subtask_size": 50,
            "params": {"normalize": True, "max_length": 256},
        })
        print(f"submitted demo/sample/{name}: {count} sentences, {MODEL}")
        status = await wait_with_progress(client, "demo", "sample", name, 0.5)
        out = data_dir / f"{name}.results.jsonl"
        lines = 0
        with out.open("wb") as f:
            async for chunk in client.results("demo", "sample", name):
                f.write(chunk)
                lines += chunk.count(b"\n")
        print(f"results: {lines} lines in {out}; the first three:")
        with out.open("rb") as f:
            for _, line in zip(range(3), f, strict=False):
                record = jsoncodec.loads(line)
                vector = record.get("embedding", [])
                preview = ", ".join(f"{v:+.4f}" for v in vector[:4])
                print(f"  {record['id']}: [{preview}, ...] ({len(vector)} dims)"
                      if vector else f"  {line.decode().strip()[:120]}")
        _ = task
        return status


async def _local_agent_ready(client: MinionsClient, timeout_s: float = 300.0) -> None:
    """The local agent takes a while to load its inference stack: submit once it serves the model,
    so the sample does not start with an (honest but alarming) "no executor serves this" warning."""
    deadline = time.monotonic() + timeout_s
    said = False
    while time.monotonic() < deadline:
        if any(MODEL in e.get("models", []) and e["status"] not in ("offline", "lost")
               for e in await client.executors()):
            return
        if not said:
            print("waiting for the local agent to load its model ...", flush=True)
            said = True
        await asyncio.sleep(0.5)
