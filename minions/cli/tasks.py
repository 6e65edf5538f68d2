"""Client commands: submit, status, wait, results, cancel, retry, executors."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from minions import jsoncodec
from minions.cli import connection
from minions.cli.client_command import Interrupted, client_command
from minions.cli.times import shown_time
from minions.kinds import FINISHED_TASK_STATUSES, KINDS, TASK_STATUSES
from minions.sdk import MinionsClient, MinionsError
from minions.sdk.parts import PartCorrupted
from minions.sdk.progress import ProgressBar, task_seconds


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("submit", help="submit a task from a JSONL or Parquet file",
                       description="Check the JSONL file, upload it under its content hash and submit the task. "
                                   "Submitting the same file with the same flags again is the same task. A "
                                   ".parquet file is read as a table: --text-column and --id-column name its "
                                   "columns (needs pyarrow: pip install 'minions[data]').")
    connection.add_arguments(p)
    p.add_argument("file", type=Path, help="JSONL input, one record per line, or a .parquet table")
    p.add_argument("--text-column", default=None,
                   help="a .parquet file's column of texts (default: the kind's field: text, prompt, messages, ms)")
    p.add_argument("--id-column", default="id",
                   help="a .parquet file's column of record ids (without one: the row number, from 0)")
    p.add_argument("--team", required=True, help="team the task belongs to (required)")
    p.add_argument("--project", required=True, help="project within the team (required)")
    p.add_argument("--name", required=True, help="task name, unique within team/project (required)")
    p.add_argument("--kind", required=True, choices=KINDS,
                   help="what to run on each record (required)")
    p.add_argument("--model", default=None,
                   help="model name, e.g. sentence-transformers/all-MiniLM-L6-v2 (required but for --kind sleep)")
    p.add_argument("--subtask-size", type=int, default=None,
                   help="records per subtask (default: the server's default for the kind)")
    p.add_argument("--priority", type=int, default=0, help="higher is claimed first, -1000..1000")
    p.add_argument("--placement", choices=("any", "trusted"), default="any",
                   help="trusted: only executors an admin vouched for run it, never a volunteer (default: any)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="a task parameter; VALUE is read as JSON when it parses (repeatable)")
    p.add_argument("--wait", action="store_true", help="then wait for it, with a progress bar")
    p.add_argument("--replace", action="store_true",
                   help="a task of this name goes first, its results with it (cancelled if it runs, then "
                        "deleted); this one takes its name")
    p.set_defaults(handler=client_command(submit_file))

    p = sub.add_parser("status", help="tasks as a table, or one task (TEAM/PROJECT/NAME)")
    connection.add_arguments(p)
    p.add_argument("task", nargs="?", help="TEAM/PROJECT/NAME (default: list the latest tasks)")
    p.add_argument("--team", help="only this team's tasks (default: all you can see)")
    p.add_argument("--status", dest="status_filter", choices=TASK_STATUSES,
                   help="only tasks in this status (default: any)")
    p.add_argument("--limit", type=int, default=30, help="at most this many tasks")
    p.add_argument("--all", dest="interactive", action="store_const", const="all", default="false",
                   help="also list the OpenAI interactive lane's requests (/v1/embeddings, /v1/chat/completions: "
                        "a task each, hidden by default)")
    p.set_defaults(handler=client_command(status))

    p = sub.add_parser("wait", help="wait for a task with a progress bar, then summarise it")
    connection.add_arguments(p)
    p.add_argument("task", help="TEAM/PROJECT/NAME")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between polls")
    p.set_defaults(handler=client_command(wait))

    p = sub.add_parser("results", help="download a task's results (JSONL, Parquet or numpy; input order)",
                       description="The results, one per input record in input order. Exits 1, saying why, "
                                   "when the task failed or was cancelled (its results are then incomplete).")
    connection.add_arguments(p, json_flag=False)  # results are JSON lines already
    p.add_argument("task", help="TEAM/PROJECT/NAME")
    p.add_argument("-o", "--output", type=Path,
                   help="file to write, in the format its extension names: .jsonl, .parquet (a table), .npy (the "
                        "embeddings as a float32 matrix; failed records NaN) (default: JSONL on stdout)")
    p.add_argument("--partial", action="store_true", help="what is committed so far, before the end")
    p.set_defaults(handler=client_command(results))

    p = sub.add_parser("cancel", help="cancel a task")
    connection.add_arguments(p)
    p.add_argument("task", help="TEAM/PROJECT/NAME")
    p.set_defaults(handler=client_command(cancel))

    p = sub.add_parser("retry", help="run a failed task's failed subtasks again (its results so far stay)",
                       description="Put a failed task's failed subtasks back in the queue, each with a fresh "
                                   "budget of attempts; the results it committed stay. The task runs again under "
                                   "its name: `minions wait` it, or pass --wait.")
    connection.add_arguments(p)
    p.add_argument("task", help="TEAM/PROJECT/NAME")
    p.add_argument("--wait", action="store_true", help="then wait for it, with a progress bar")
    p.set_defaults(handler=client_command(retry))

    p = sub.add_parser("executors", help="executors as a table, with the models each serves")
    connection.add_arguments(p)
    p.add_argument("--team", help="only executors scoped to this team (default: all you can see)")
    p.set_defaults(handler=client_command(executors))

    p = sub.add_parser("executor", help="one executor: executor release ID lifts its quarantine (admin)")
    actions = p.add_subparsers(dest="action", required=True)
    q = actions.add_parser("release", help="lift an executor's quarantine (admin); its results are checked "
                                           "again until it earns trust")
    connection.add_arguments(q)
    q.add_argument("executor_id", help="the executor's id (minions executors --json)")
    q.set_defaults(handler=client_command(executor_release))


def task_path(value: str) -> tuple[str, str, str]:
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


def _warnings(task: dict[str, Any]) -> list[str]:
    return [w["message"] for w in task.get("warnings") or ()]


def _print_warnings(task: dict[str, Any]) -> None:
    for message in _warnings(task):
        print(f"warning: {message}", file=sys.stderr)


async def _existing(client: MinionsClient, team: str, project: str, name: str) -> dict[str, Any] | None:
    try:
        return await client.task(team, project, name)
    except MinionsError as exc:
        if exc.status == 404:
            return None
        raise


async def submit_file(args: argparse.Namespace) -> int:
    """`minions submit`: a JSONL file as it is (`submit`); a .parquet file as the JSONL of its records
    (checked as they are written), then the same."""
    from minions.sdk.tables import TableError, is_table

    if not is_table(args.file):
        if args.text_column is not None or args.id_column != "id":
            print("minions: --text-column and --id-column name a .parquet file's columns; a JSONL file's "
                  "records name their own fields", file=sys.stderr)
            return 2
        return await submit(args)
    if not args.file.is_file():
        return await submit(args)  # which says so
    from minions.cli.table_io import parquet_as_jsonl

    with tempfile.TemporaryDirectory(prefix="minions-submit-") as into:
        try:
            args.file = await asyncio.to_thread(parquet_as_jsonl, args.file, args.kind, args.id_column,
                                                args.text_column, Path(into))
        except (TableError, ImportError, ValueError, OSError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            print(f"minions: {args.file}: {exc}; nothing was uploaded", file=sys.stderr)
            return 2
        return await submit(args)


async def submit(args: argparse.Namespace) -> int:
    from minions.cli.input_check import InputProblem, check_input
    from minions.task_fields import problems_message, task_field_problems

    if not args.file.is_file():
        raise SystemExit(f"minions: no such file: {args.file}")
    body: dict[str, Any] = {
        "team": args.team, "project": args.project, "name": args.name, "kind": args.kind,
        "priority": args.priority, "params": _params(args.param),
    }
    if args.model:
        body["model"] = args.model
    if args.subtask_size is not None:
        body["subtask_size"] = args.subtask_size
    if args.placement != "any":
        body["placement"] = args.placement
    # Everything is checked before anything is uploaded (the fields as the API checks them, then the
    # records): a rejected submit leaves no object behind.
    problems = task_field_problems({**body, "input": {"uri": "s3://checked-before-upload/input.jsonl"}})
    if problems:
        flags = "".join(f"\n  --{k.replace('_', '-')}: {v}" for k, v in problems.items())
        print(f"minions: {problems_message(problems)}{flags}", file=sys.stderr)
        return 2
    try:
        checked = await asyncio.to_thread(check_input, args.file, args.kind)
    except InputProblem as exc:
        print(f"minions: {exc}; nothing was uploaded", file=sys.stderr)
        return 2
    async with connection.client_from_args(args) as client:
        existing = await _existing(client, args.team, args.project, args.name)
        same_input = existing is not None and (existing["input_uri"] or "").endswith(f"/{checked.sha256}.jsonl")
        if existing is not None and not same_input and not args.replace:
            ref = f"{args.team}/{args.project}/{args.name}"
            print(f"minions: task {ref} exists with another input (nothing was uploaded): choose another --name, "
                  f"or pass --replace (the old task and its results go)"
                  + (f", or `minions retry {ref}` to run its failed subtasks again" if existing["status"] == "failed"
                     else ""), file=sys.stderr)
            return 1
        # The same file is the same object (uploaded under its SHA-256), so the same command again
        # is the same request: the server answers with the task (200), not a conflict.
        uri = existing["input_uri"] if existing is not None and same_input else \
            await client.upload_input(_file_chunks(args.file), sha256=checked.sha256)
        if existing is not None and args.replace:
            # The old task goes only once the server has judged the new body whole (a 403 or 422
            # then leaves the old one as it was).
            await client.judge({**body, "input": {"uri": uri}})
            await _replace(client, existing)
        task = await client.submit({**body, "input": {"uri": uri}})
        if not args.json:
            print(f"submitted {task['team']}/{task['project']}/{task['name']} ({task['status']}; "
                  f"{checked.records:,} records)")
            _print_warnings(task)
        if args.wait:
            # --json --wait: one JSON document, the task as it ended.
            return await wait_with_progress(client, args.team, args.project, args.name, 0.5, quiet=args.json,
                                            warned=bool(_warnings(task)))
        if args.json:
            print(jsoncodec.dumps_str(task))
    return 0


async def _replace(client: MinionsClient, task: dict[str, Any]) -> None:
    """The task goes before its successor takes the name: cancelled if it has not ended, then deleted
    with its subtasks, so none of its results can be read again (the new task has another id, and
    every output key carries it); its objects are the garbage collector's."""
    ref = f"{task['team']}/{task['project']}/{task['name']}"
    await client.discard(task["team"], task["project"], task["name"])
    print(f"replacing {ref}: the old task ({task['status']}, {task['records']['done']:,} records done) and its "
          "results are deleted", file=sys.stderr)


def _row(task: dict[str, Any]) -> list[str]:
    records = task["records"]
    state = task["status"] + (" (!)" if _warnings(task) else "")
    return [f"{task['team']}/{task['project']}/{task['name']}", task["kind"], task["model"], state,
            f"{records['done']:,}/{records['total']:,}",
            f"{task['subtasks']['done']}/{task['subtasks']['total']}", shown_time(task["created_at"])]


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    for line in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=False)).rstrip())


TASK_HEADER = ["TASK", "KIND", "MODEL", "STATUS", "RECORDS", "SUBTASKS", "CREATED"]


async def status(args: argparse.Namespace) -> int:
    async with connection.client_from_args(args) as client:
        if args.task:
            task = await client.task(*task_path(args.task))
            if args.json:
                print(jsoncodec.dumps_str(task))
            else:
                print_table(TASK_HEADER, [_row(task)])
                if task["error"]:
                    print(f"error: {task['error']}")
                for message in _warnings(task):
                    print(f"warning: {message}")
            return 0
        page = await client.tasks(team=args.team, status=args.status_filter, limit=args.limit,
                                  interactive=args.interactive)
        if args.json:
            print(jsoncodec.dumps_str(page))
        elif not page["tasks"]:
            print("no tasks")
        else:
            print_table(TASK_HEADER, [_row(t) for t in page["tasks"]])
            if any(_warnings(t) for t in page["tasks"]):
                print("(!) no online executor serves this task's kind and model; `minions status TASK` says more")
    return 0


async def wait(args: argparse.Namespace) -> int:
    async with connection.client_from_args(args) as client:
        return await wait_with_progress(client, *task_path(args.task), args.interval, quiet=args.json)


async def wait_with_progress(client: MinionsClient, team: str, project: str, name: str, interval: float,
                *, quiet: bool = False, warned: bool = False) -> int:
    """Polls the task until it ends, a progress bar meanwhile; a warning (no executor serves it) is
    said once, and not at all when the caller said it already (`warned`)."""
    ref = f"{team}/{project}/{name}"
    bar = ProgressBar(ref)
    try:
        while True:
            task = await client.task(team, project, name)
            if not quiet:
                if not warned and _warnings(task):
                    _print_warnings(task)
                    warned = True
                bar.update(task)
            if task["status"] in FINISHED_TASK_STATUSES:
                break
            await asyncio.sleep(interval)
    except asyncio.CancelledError:
        # Ctrl-C (asyncio.run cancels the command): only the waiting stops. Said after the bar is gone.
        bar.finish()
        raise Interrupted(f"stopped waiting; {ref} keeps running. Wait again: `minions wait {ref}`; "
                          f"cancel it: `minions cancel {ref}`") from None
    finally:
        bar.finish()
    if quiet:
        print(jsoncodec.dumps_str(task))
    else:
        records = task["records"]
        # The task's own duration (first claim to end), not how long this command watched it.
        duration = task_seconds(task)
        seconds = duration if duration is not None else bar.elapsed
        rate = records["done"] / seconds if seconds > 0 else 0.0
        print(f"{task['status']}: {records['done']:,}/{records['total']:,} records in "
              f"{seconds:.1f}s ({rate:,.1f} records/s); subtasks: "
              + ", ".join(f"{v} {k}" for k, v in task["subtasks"].items() if v and k != "total"))
        if task["error"]:
            print(f"error: {task['error']}")
    return 0 if task["status"] == "completed" else 1


def _cli_hint(exc: MinionsError) -> MinionsError:
    """The server's hints name its query string; on the command line they name the flag."""
    if exc.code == "not_finished":
        first = exc.message.split(";")[0]
        return MinionsError(exc.status, exc.code, f"{first}; results are ready when it ends (or pass --partial "
                                                  "for what is committed so far)")
    return exc


async def results(args: argparse.Namespace) -> int:
    from minions.cli.table_io import output_problem, why_incomplete

    team, project, name = task_path(args.task)
    if (problem := output_problem(args.output)) is not None:
        print(f"minions: {problem}", file=sys.stderr)
        return 2
    async with connection.client_from_args(args) as client:
        task = None if args.partial else await client.task(team, project, name)
        code = await _download(client, args, team, project, name, None if task is None else task["records"]["total"])
        if code == 0 and task is not None and task["status"] in ("failed", "cancelled"):
            print(f"minions: {why_incomplete(task)}", file=sys.stderr)
            return 1
        return code


async def _download(client: MinionsClient, args: argparse.Namespace, team: str, project: str, name: str,
                    total: int | None) -> int:
    if args.output is not None and args.output.suffix.lower() != ".jsonl":
        from minions.cli.table_io import row_progress
        from minions.sdk.results import FailedResults

        try:  # a table, or a matrix: failed records are kept, marked (failed, error) or NaN
            rows = await client.results(f"{team}/{project}/{name}", partial=args.partial).write(
                args.output, allow_failed=True, progress=row_progress(f"writing {args.output}", total))
        except MinionsError as exc:
            raise _cli_hint(exc) from None
        except PartCorrupted as exc:
            raise SystemExit(f"minions: results of {args.task} are corrupted in the store: {exc}") from None
        except (FailedResults, TypeError, ValueError, ImportError) as exc:
            print(f"minions: cannot write {args.output}: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {rows:,} results to {args.output}", file=sys.stderr)
        return 0
    try:
        if args.output is None:
            async for chunk in client.results(team, project, name, partial=args.partial):
                sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
            return 0
        lines = 0
        with args.output.open("wb") as out:
            async for chunk in client.results(team, project, name, partial=args.partial,
                                              progress=_download_progress()):
                lines += chunk.count(b"\n")
                await asyncio.to_thread(out.write, chunk)
    except MinionsError as exc:
        raise _cli_hint(exc) from None
    except PartCorrupted as exc:  # never written as if whole: the command fails
        raise SystemExit(f"minions: results of {args.task} are corrupted in the store: {exc}") from None
    print(f"wrote {lines:,} results to {args.output}", file=sys.stderr)
    return 0


def _download_progress() -> Callable[[int, int], None]:
    """Bytes of result parts fetched so far, on stderr (a line a second when it is not a terminal)."""
    last = 0.0

    def show(done: int, total: int) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last < (0.2 if sys.stderr.isatty() else 1.0) and done < total:
            return
        last = now
        line = f"results: {done:,} of {total:,} bytes ({100 * done / max(total, 1):.0f}%)"
        sys.stderr.write("\r\x1b[2K" + line + ("\n" if done >= total else "") if sys.stderr.isatty()
                         else line + "\n")
        sys.stderr.flush()

    return show


async def cancel(args: argparse.Namespace) -> int:
    async with connection.client_from_args(args) as client:
        task = await client.cancel(*task_path(args.task))
        print(jsoncodec.dumps_str(task) if args.json else f"{args.task}: {task['status']}")
    return 0


async def retry(args: argparse.Namespace) -> int:
    team, project, name = task_path(args.task)
    async with connection.client_from_args(args) as client:
        # Counted before: the task the retry answers may have its first subtasks claimed already (an
        # executor waiting in its long poll wins them within milliseconds), so its pending count is not
        # what went back; a failed task's failed subtasks do not change until the retry.
        failed = (await client.task(team, project, name))["subtasks"]["failed"]
        task = await client.retry(team, project, name)
        if not args.json:
            print(f"{args.task}: {task['status']} again; {failed} failed subtask(s) back in "
                  "the queue, its committed results kept")
            _print_warnings(task)
        if args.wait:
            return await wait_with_progress(client, team, project, name, 0.5, quiet=args.json,
                                            warned=bool(_warnings(task)))
        if args.json:
            print(jsoncodec.dumps_str(task))
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
    print_table(["NAME", "STATUS", "DEVICE", "BACKEND", "KINDS", "MODELS", "TRUST", "CURRENT", "LAST HEARTBEAT"], [
        [e["name"], e["status"], str(e["hardware"].get("device", "?")), _backends(e["hardware"]), ",".join(e["kinds"]),
         ",".join(e.get("models") or ()) or "-", _trust(e.get("trust")),
         ", ".join(f"{c['team']}/{c['project']}/{c['task_name']}#{c['subtask_id']}" for c in e["current"]) or "-",
         shown_time(e["last_heartbeat_at"])]
        for e in rows
    ])
    return 0


def _backends(hardware: dict[str, Any]) -> str:
    """The engines and precisions the agent chose at model load (`mlx/fp16,torch/fp32`), from the
    precision entries of its registration; an entry without a backend is an older agent's: torch."""
    entries = hardware.get("precision")
    if not isinstance(entries, list):
        return "-"
    chosen = [f"{p.get('backend') or 'torch'}/{p.get('precision') or '?'}" for p in entries if isinstance(p, dict)]
    return ",".join(dict.fromkeys(chosen)) or "-"


def _trust(trust: dict[str, Any] | None) -> str:
    """An executor's trust (sql/schema/11_checks.sql) in a few words: agreements and disagreements, or
    its quarantine."""
    if not trust:
        return "-"
    counts = f"{trust['agreements']} agreed, {trust['disagreements']} outvoted"
    if trust["quarantined_at"]:
        return f"QUARANTINED ({counts}): {trust['quarantine_reason']}"
    return f"{'trusted' if trust['trusted'] else 'checked'} ({counts})"


async def executor_release(args: argparse.Namespace) -> int:
    async with connection.client_from_args(args) as client:
        result = await client.release_executor(args.executor_id)
    print(jsoncodec.dumps_str(result) if args.json else f"executor {args.executor_id}: quarantine lifted")
    return 0
