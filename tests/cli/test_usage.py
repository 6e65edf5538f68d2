"""`minions usage` against real services: a table per team, executor or owner with a total line,
`--json` the API's document, and an unparsable `--since` refused before any request is made."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from minions import jsoncodec
from minions.db.connect import connect
from minions.testing.factories import make_tokens
from minions.testing.processes import Services
from tests.cli.conftest import Cli
from tests.support.paths import REPO
from tests.support.usage import build_pool


async def test_usage_by_team_executor_and_owner(services: Services, database_url: str, tmp_path: Path) -> None:
    # The attempts first, the services after: a running splitter would split the pool's tasks itself.
    conn = await connect(database_url)
    try:
        pool = await build_pool(conn)
    finally:
        await conn.close()
    await services.start_all()
    admin, executor = await make_tokens(database_url)
    (tmp_path / "cwd").mkdir()
    cli = Cli(services, admin, executor, tmp_path / "cwd")

    teams = await cli.run("usage")
    assert teams.returncode == 0, teams.stderr
    lines = teams.stdout.splitlines()
    assert lines[0].startswith("usage of every team since ") and lines[0].endswith("UTC, by team")
    assert lines[1].split() == ["TEAM", "USED", "VERIFICATION", "LOST", "RECORDS", "ATTEMPTS"]
    rows = {line.split()[0]: line for line in lines[2:]}
    assert set(rows) == {"search", "ads", "TOTAL"}
    # search: its spot-check replicas 0.05 s (VERIFICATION), 30 s of a lost lease nobody's (LOST).
    assert rows["search"].split()[2:4] == ["0.1s", "30.0s"], rows["search"]
    assert rows["search"].split()[-2:] == ["20", "12"] and rows["ads"].split()[-2:] == ["4", "4"]

    owners = await cli.run("usage", "--by", "owner", "--since", "2w")
    assert owners.returncode == 0, owners.stderr
    assert {line.split()[0] for line in owners.stdout.splitlines()[2:]} == {
        "alice", "bob", "mallory", "token", "TOTAL"}  # 'token <id>': the unlabelled owner

    executors = await cli.run("usage", "--by", "executor", "--team", "ads", "--json")
    assert executors.returncode == 0, executors.stderr
    report = jsoncodec.loads(executors.stdout)
    assert (report["team"], report["by"]) == ("ads", "executor")
    assert {(r["executor"], r["owner"]) for r in report["usage"]} == {
        ("bob-box", "bob"), ("lab-box", f"token {pool.unlabelled_token}")}
    assert report["totals"]["attempts"] == 4
    status, api = await cli.get("/api/v1/usage?by=executor&team=ads")
    assert status == 200 and isinstance(api, dict) and api["usage"] == report["usage"]


def test_an_unparsable_since_is_refused_before_any_request() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MINIONS_TOKEN": "mn_unused"}
    # Nothing listens on port 9: had a request been made, the error would be "cannot reach the API".
    result = subprocess.run(
        [sys.executable, "-m", "minions.cli.main", "usage", "--since", "last tuesday", "--api-url",
         "http://127.0.0.1:9"], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert result.returncode == 2, result
    assert "--since 'last tuesday': a duration back from now such as 3600, 90m, 12h, 7d or 2w" in result.stderr
    assert "cannot reach" not in result.stderr
