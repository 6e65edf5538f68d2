"""`minions verify TASK`: a finished task's suspect results run again by others, and what changed.

The server makes a verification task (POST .../verify): the subtasks whose committed result came
from an executor quarantined since (every done subtask with --all), the same input, the same model
(pinned to the revision the task named, else by its first lease, as any task's). This waits for it
with a progress bar, then compares each re-run record with the task's own result by the rule a spot
check uses (minions/result_agreement.py) and lists the records that differ. Exit 0: nothing differs;
1: some records differ or could not be re-run.
"""

from __future__ import annotations

import argparse
import sys
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
                   help="re-run every subtask, not only those whose result came from a quarantined executor")
    p.add_argument("--min-cosine", type=float, default=0.999, help="embeddings agree at this cosine or more")
    p.add_argument("--min-similarity", type=float, default=0.9,
                   help="completions agree at this text similarity or more (0 to 1)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between polls while waiting")
    p.set_defaults(handler=client_command(verify))


async def _results_by_id(client: MinionsClient, team: str, project: str, name: str,
                         wanted: set[bytes] | None = None) -> dict[bytes, dict[str, Any]]:
    """A task's results keyed by their id's JSON; only the ids in `wanted` when given."""
    out: dict[bytes, dict[str, Any]] = {}
    buffer = b""
    async for chunk in client.results(team, project, name):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                record = jsoncodec.loads(line)
                key = jsoncodec.dumps(record.get("id"))
                if wanted is None or key in wanted:
                    out[key] = record
    return out


async def verify(args: argparse.Namespace) -> int:
    team, project, name = task_path(args.task)
    if not 0 <= args.min_similarity <= 1 or not -1 <= args.min_cosine <= 1:
        raise SystemExit("minions verify: --min-cosine is from -1 to 1 and --min-similarity from 0 to 1")
    async with connection.client_from_args(args) as client:
        made = await client.verify(team, project, name, every=args.every)
        task = made["task"]
        if task is None:
            hint = "" if args.every else " (--all re-runs every subtask)"
            message = f"nothing to verify: no result of {args.task} came from a quarantined executor{hint}"
            print(jsoncodec.dumps_str({"verify_task": None, "records": 0}) if args.json else message)
            return 0
        if not args.json:
            print(f"re-running {made['subtasks']} subtask(s) of {args.task} as {team}/{project}/{task['name']}",
                  file=sys.stderr)
        if args.json:  # one document out: the report
            await client.wait(f"{team}/{project}/{task['name']}", interval_s=args.interval)
        else:
            await wait_with_progress(client, team, project, task["name"], args.interval)
        fresh = await _results_by_id(client, team, project, task["name"])
        kept = await _results_by_id(client, team, project, name, set(fresh))
    kind = task["kind"]
    differ: list[tuple[Any, str]] = []
    not_rerun = 0
    for key, again in fresh.items():
        before = kept.get(key, {})
        if "error" in again and "error" in before:
            continue  # failed both times: nothing to compare, nothing changed
        if "error" in again:
            not_rerun += 1
        elif not records_agree(kind, before, again, args.min_cosine, args.min_similarity):
            score = record_score(kind, before, again) if "error" not in before else float("nan")
            differ.append((again.get("id"), "its result was a failure" if "error" in before else f"{score:.4f}"))
    report = {"verify_task": f"{team}/{project}/{task['name']}", "records": len(fresh),
              "agree": len(fresh) - len(differ) - not_rerun, "differ": [{"id": i, "score": s} for i, s in differ],
              "not_rerun": not_rerun}
    if args.json:
        print(jsoncodec.dumps_str(report))
    else:
        limit = {"embedding": f"cosine {args.min_cosine}", "completion": f"similarity {args.min_similarity}"}
        print(f"{args.task}: {len(fresh):,} record(s) re-run, {report['agree']:,} agree, {len(differ):,} differ"
              f" (below {limit.get(kind, 'equal ids')}), {not_rerun:,} could not be re-run")
        if differ:
            print_table(["ID", "COSINE" if kind == "embedding" else "SIMILARITY"],
                        [[jsoncodec.dumps_str(i), s] for i, s in differ[:SHOWN]])
            if len(differ) > SHOWN:
                print(f"... and {len(differ) - SHOWN:,} more (--json lists them all)")
    return 1 if differ or not_rerun else 0
