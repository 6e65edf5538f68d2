"""`minions verify TASK`: a finished task's suspect results run again by others, and what changed.

The server makes a verification task (POST .../verify): the subtasks whose committed result is
suspect (it came from an executor quarantined since, it was committed unchecked, or it is a
volunteer's that no vouched executor agreed with; every done subtask with --all), the same input,
the same model, run on vouched executors only (never the volunteers that made them, nor a made-up
fingerprint). This waits for it with a progress bar, then compares each re-run record with the
task's own result by the rule a spot check uses (minions/result_agreement.py), reading both result
streams side by side in bounded memory (the re-run's records are the task's, in the task's order),
and lists the records that differ. Exit 0: nothing differs; 1: some records differ or could not be
re-run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator
from typing import Any

from minions import jsoncodec
from minions.cli import connection
from minions.cli.client_command import client_command
from minions.cli.tasks import print_table, task_path, wait_with_progress
from minions.result_agreement import record_score, records_agree
from minions.sdk import MinionsClient

SHOWN = 20  # differing records listed; the count says how many in all


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("verify", help="run a finished task's suspect results again and report what changed")
    connection.add_arguments(p)
    p.add_argument("task", help="TEAM/PROJECT/NAME (a finished task)")
    p.add_argument("--all", action="store_true", dest="every",
                   help="re-run every subtask, not only the suspect ones (from an executor quarantined since, "
                        "committed unchecked, or a volunteer's no vouched executor agreed with)")
    p.add_argument("--min-cosine", type=float, default=0.999, help="embeddings agree at this cosine or more")
    p.add_argument("--min-similarity", type=float, default=0.9,
                   help="completions agree at this text similarity or more (0 to 1)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between polls while waiting")
    p.set_defaults(handler=client_command(verify))


async def _records(client: MinionsClient, team: str, project: str, name: str) -> AsyncIterator[dict[str, Any]]:
    """A task's results, one record at a time as they stream in."""
    buffer = b""
    async for chunk in client.results(team, project, name):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield jsoncodec.loads(line)
    if buffer.strip():
        yield jsoncodec.loads(buffer)


async def _next_with_id(records: AsyncIterator[dict[str, Any]], wanted: Any) -> dict[str, Any]:
    """The next record of `records` whose id is `wanted` (those before it are passed over); {} at the end."""
    async for record in records:
        if record.get("id") == wanted:
            return record
    return {}


async def verify(args: argparse.Namespace) -> int:
    team, project, name = task_path(args.task)
    if not 0 <= args.min_similarity <= 1 or not -1 <= args.min_cosine <= 1:
        raise SystemExit("minions verify: --min-cosine is from -1 to 1 and --min-similarity from 0 to 1")
    async with connection.client_from_args(args) as client:
        made = await client.verify(team, project, name, every=args.every)
        task = made["task"]
        if task is None:
            hint = "" if args.every else " (--all re-runs every subtask)"
            message = (f"nothing to verify: no result of {args.task} is suspect (from an executor quarantined since, "
                       f"committed unchecked, or a volunteer's no vouched executor agreed with){hint}")
            print(jsoncodec.dumps_str({"verify_task": None, "records": 0}) if args.json else message)
            return 0
        if not args.json:
            print(f"re-running {made['subtasks']} subtask(s) of {args.task} as {team}/{project}/{task['name']}",
                  file=sys.stderr)
        if args.json:  # one document out: the report
            await client.wait(f"{team}/{project}/{task['name']}", interval_s=args.interval)
        else:
            await wait_with_progress(client, team, project, task["name"], args.interval)
        kind = task["kind"]
        differ: list[tuple[Any, str]] = []
        not_rerun = rerun = 0
        kept = _records(client, team, project, name)
        async for again in _records(client, team, project, task["name"]):
            rerun += 1
            before = await _next_with_id(kept, again.get("id"))
            if "error" in again and "error" in before:
                continue  # failed both times: nothing to compare, nothing changed
            if "error" in again:
                not_rerun += 1
            elif not records_agree(kind, before, again, args.min_cosine, args.min_similarity):
                score = record_score(kind, before, again) if before and "error" not in before else float("nan")
                why = "its result was a failure" if "error" in before else "missing" if not before else f"{score:.4f}"
                differ.append((again.get("id"), why))
    report = {"verify_task": f"{team}/{project}/{task['name']}", "records": rerun,
              "agree": rerun - len(differ) - not_rerun,
              "differ": [{"id": i, "score": s} for i, s in differ], "not_rerun": not_rerun}
    if args.json:
        print(jsoncodec.dumps_str(report))
    else:
        limit = {"embedding": f"cosine {args.min_cosine}", "completion": f"similarity {args.min_similarity}"}
        print(f"{args.task}: {rerun:,} record(s) re-run, {report['agree']:,} agree, {len(differ):,} differ"
              f" (below {limit.get(kind, 'equal ids')}), {not_rerun:,} could not be re-run")
        if differ:
            print_table(["ID", "COSINE" if kind == "embedding" else "SIMILARITY"],
                        [[jsoncodec.dumps_str(i), s] for i, s in differ[:SHOWN]])
            if len(differ) > SHOWN:
                print(f"... and {len(differ) - SHOWN:,} more (--json lists them all)")
    return 1 if differ or not_rerun else 0
