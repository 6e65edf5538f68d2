"""Client commands: submit, status, wait, results, cancel, executors."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from minions import jsoncodec
from minions.cli import connection
from minions.cli.progress import ProgressBar
from minions.sdk import MinionsClient, MinionsError

FINISHED = ("completed", "failed", "cancelled")


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("submit", help="submit a task from a JSONL file")
    connection.add_arguments(p)
    p.add_argument("file", type=Path, help="JSONL input, one record per line")
    p.add_argument("--team", required=True)
    p.add_argument("--project", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--kind", required=True, choices=("embedding", "completion", "sleep"))
    p.add_argument("--model", default=None)
    p.add_argument("--subtask-size", type=int, default=None)
    p.add_argument("--priority", type=int, default=0)
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="a task parameter; VALUE is read as JSON when it parses (repeatable)")
    p.add_argument("--wait", action="store_true", help="then wait for it, with a progress bar")
    p.set_defaults(handler=submit)

    p = sub.add_parser("status", help="tasks as a table, or one task (TEAM/PROJECT/NAME)")
    connection.add_arguments(p)
    p.add_argument("task", nargs="?", help="TEAM/PROJECT/NAME")
    p.add_argument("--team")
    p.add_argument("--status", dest="status_filter")
    p.add_argument("--limit", type=int, default=30)
    p.set_defaults(handler=status)

    p = sub.add_parser("wait", help="wait for a task with a progress bar, then summarise it")
    connection.add_arguments(p)
    p.add_argument("task", help="TEAM/PROJECT/NAME")
    p.add_argument("--interval", type=float, default=0.5)
    p.set_defaults(handler=wait)

    p = sub.add_parser("results", help="download a task's results (JSONL, input order)")
    connection.add_arguments(p)
    p.add_argument("task", help="TEAM/PROJECT/NAME")
    p.add_argument("-o", "--output", type=Path, help="file to write (default: stdout)")
    p.add_argument("--partial", action="store_true", help="what is committed so far, before the end")
    p.set_defaults(handler=results)

    p = sub.add_parser("cancel", help="cancel a task")
    connection.add_arguments(p)
    p.add_argument("task", help="TEAM/PROJECT/NAME")
    p.set_defaults(handler=cancel)

    p = sub.add_parser("executors", help="executors as a table")
    connection.add_arguments(p)
    p.add_argument("--team")
    p.set_defaults(handler=executors)


def _task_path(value: str) -> tuple[str, str, str]:
    parts = value.split("/")
    if len(parts) != 3 or not all(parts):
        raise SystemExit(f"minions: expected TEAM/PROJECT/NAME, got {value!r}")
    return parts[0], parts[1], parts[2]


def _params(pairs: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"minions: --param takes KEY=VALUE, got {pair!r}")
        try:
            params[key] = jsoncodec.loads(raw)
        except ValueError:
            params[key] = raw
    return params


async def _file_chunks(path: Path) -> AsyncIterator[bytes]:
    with path.open("rb") as f:  # reads go to a thread: the event loop never blocks on the disk
        while chunk := await asyncio.to_thread(f.read, 1 << 20):
            yield chunk


def run(args: argparse.Namespace) -> int:
    try:
        result: int = asyncio.run(args.handler(args))
        return result
    except MinionsError as exc:
        print(f"minions: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"minions: cannot reach the API: {exc}", file=sys.stderr)
        return 1


async def submit(args: argparse.Namespace) -> int:
    if not args.file.is_file():
        raise SystemExit(f"minions: no such file: {args.file}")
    async with connection.client_from_args(args) as client:
        uri = await client.upload_input(_file_chunks(args.file))
        body: dict[str, Any] = {
            "team": args.team, "project": args.project, "name": args.name, "kind": args.kind,
            "input": {"uri": uri}, "priority": args.priority, "params": _params(args.param),
        }
        if args.model:
            body["model"] = args.model
        if args.subtask_size is not None:
            body["subtask_size"] = args.subtask_size
        task = await client.submit(body)
        if args.json:
            print(jsoncodec.dumps_str(task))
        else:
            print(f"submitted {task['team']}/{task['project']}/{task['name']} ({task['status']})")
        if args.wait:
            return await _wait(client, args.team, args.project, args.name, 0.5, quiet=args.json)
    return 0


def _row(task: dict[str, Any]) -> list[str]:
    records = task["records"]
    return [f"{task['team']}/{task['project']}/{task['name']}", task["kind"], task["model"], task["status"],
            f"{records['done']:,}/{records['total']:,}",
            f"{task['subtasks']['done']}/{task['subtasks']['total']}", (task["created_at"] or "")[:19]]


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    for line in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=False)).rstrip())


async def status(args: argparse.Namespace) -> int:
    async with connection.client_from_args(args) as client:
        if args.task:
            task = await client.task(*_task_path(args.task))
            if args.json:
                print(jsoncodec.dumps_str(task))
            else:
                print_table(["TASK", "KIND", "MODEL", "STATUS", "RECORDS", "SUBTASKS", "CREATED"], [_row(task)])
                if task["error"]:
                    print(f"error: {task['error']}")
            return 0
        page = await client.tasks(team=args.team, status=args.status_filter, limit=args.limit)
        if args.json:
            print(jsoncodec.dumps_str(page))
        elif not page["tasks"]:
            print("no tasks")
        else:
            print_table(["TASK", "KIND", "MODEL", "STATUS", "RECORDS", "SUBTASKS", "CREATED"],
                        [_row(t) for t in page["tasks"]])
    return 0


async def wait(args: argparse.Namespace) -> int:
    async with connection.client_from_args(args) as client:
        return await _wait(client, *_task_path(args.task), args.interval, quiet=args.json)


async def _wait(client: MinionsClient, team: str, project: str, name: str, interval: float,
                *, quiet: bool = False) -> int:
    bar = ProgressBar(f"{team}/{project}/{name}")
    while True:
        task = await client.task(team, project, name)
        if not quiet:
            bar.update(task)
        if task["status"] in FINISHED:
            break
        await asyncio.sleep(interval)
    if quiet:
        print(jsoncodec.dumps_str(task))
    else:
        bar.finish()
        records = task["records"]
        rate = records["done"] / bar.elapsed if bar.elapsed > 0 else 0.0
        print(f"{task['status']}: {records['done']:,}/{records['total']:,} records in "
              f"{bar.elapsed:.1f}s ({rate:,.1f} records/s); subtasks: "
              + ", ".join(f"{v} {k}" for k, v in task["subtasks"].items() if v and k != "total"))
        if task["error"]:
            print(f"error: {task['error']}")
    return 0 if task["status"] == "completed" else 1


async def results(args: argparse.Namespace) -> int:
    team, project, name = _task_path(args.task)
    async with connection.client_from_args(args) as client:
        if args.output is None:
            async for chunk in client.results(team, project, name, partial=args.partial):
                sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
            return 0
        lines = 0
        with args.output.open("wb") as out:
            async for chunk in client.results(team, project, name, partial=args.partial):
                lines += chunk.count(b"\n")
                await asyncio.to_thread(out.write, chunk)
        print(f"wrote {lines:,} results to {args.output}", file=sys.stderr)
    return 0


async def cancel(args: argparse.Namespace) -> int:
    async with connection.client_from_args(args) as client:
        task = await client.cancel(*_task_path(args.task))
        print(jsoncodec.dumps_str(task) if args.json else f"{args.task}: {task['status']}")
    return 0


async def executors(args: argparse.Namespace) -> int:
    async with connection.client_from_args(args) as client:
        rows = await client.executors(args.team)
    if args.json:
        print(jsoncodec.dumps_str({"executors": rows}))
        return 0
    if not rows:
        print("no executors registered")
        return 0
    print_table(["NAME", "STATUS", "DEVICE", "KINDS", "CURRENT", "LAST HEARTBEAT"], [
        [e["name"], e["status"], str(e["hardware"].get("device", "?")), ",".join(e["kinds"]),
         ", ".join(f"{c['team']}/{c['project']}/{c['task_name']}#{c['subtask_id']}" for c in e["current"]) or "-",
         (e["last_heartbeat_at"] or "")[:19]]
        for e in rows
    ])
    return 0
