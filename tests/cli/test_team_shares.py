"""`minions team set-weight|set-priority-cap|set-max-leases|shares` against real services: an admin
sets each value and reads them back as a table or JSON, a bad number is refused with its rule before
any request, and the API's refusals (an unknown team, a token that is not an admin's) are one line."""

from __future__ import annotations

from minions import jsoncodec
from minions.db.connect import connect
from minions.testing.factories import make_token
from tests.cli.conftest import Cli

NOWHERE = "http://127.0.0.1:9"  # nothing listens: a command that got that far would say so


async def _user(cli: Cli, team: str) -> str:
    conn = await connect(cli.services.database_url)
    try:
        return (await make_token(conn, "user", team))[0]
    finally:
        await conn.close()


async def test_an_admin_sets_and_lists_team_shares(cli: Cli) -> None:
    alpha = await _user(cli, "alpha")
    await _user(cli, "beta")
    listed = await cli.run("team", "shares", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [(t["team"], t["weight"], t["priority_cap"], t["max_leases"]) for t in
            jsoncodec.loads(listed.stdout)["teams"]] == [("alpha", 1.0, 0, 0), ("beta", 1.0, 0, 0)]

    for command, expected in ((("set-weight", "alpha", "3"), "weight 3,"),
                              (("set-priority-cap", "alpha", "-5"), "priority cap -5,"),
                              (("set-max-leases", "alpha", "2"), "max leases 2"),
                              (("set-max-leases", "beta", "0"), "max leases no cap")):
        done = await cli.run("team", *command)
        assert done.returncode == 0 and expected in done.stdout, (command, done.stdout, done.stderr)
    table = (await cli.run("team", "shares")).stdout.splitlines()
    assert table[0].split() == ["TEAM", "WEIGHT", "PRIORITY", "CAP", "MAX", "LEASES", "SET"], table
    assert table[1].split()[:4] == ["alpha", "3", "-5", "2"] and table[2].split()[:5] == ["beta", "1", "0", "no",
                                                                                          "cap"], table
    # A team's user sees its own team.
    own = await cli.run("team", "shares", "--json", "--token", alpha)
    assert [t["team"] for t in jsoncodec.loads(own.stdout)["teams"]] == ["alpha"], own.stderr


async def test_bad_numbers_are_refused_before_any_request(cli: Cli) -> None:
    for command, rule in ((("set-weight", "alpha", "0"), "weight must be a number above 0"),
                          (("set-weight", "alpha", "nan"), "weight must be a number above 0"),
                          (("set-weight", "alpha", "2000000"), "at most 1,000,000"),
                          (("set-priority-cap", "alpha", "1001"), "priority cap must be an integer from -1000"),
                          (("set-priority-cap", "alpha", "1.5"), "priority cap must be an integer"),
                          (("set-max-leases", "alpha", "-1"), "max leases must be an integer from 0"),
                          (("set-max-leases", "alpha", "many"), "max leases must be an integer"),
                          (("set-weight", "no team", "2"), "not a valid team name")):
        refused = await cli.run("team", *command, "--api-url", NOWHERE)
        assert refused.returncode == 2 and rule in refused.stderr, (command, refused.stderr)
        assert "cannot reach" not in refused.stderr


async def test_the_apis_refusals_are_one_line(cli: Cli) -> None:
    alpha = await _user(cli, "alpha")
    unknown = await cli.run("team", "set-weight", "nobody", "2")
    assert unknown.returncode == 1 and "422 unknown_team" in unknown.stderr, unknown.stderr
    assert "Traceback" not in unknown.stderr
    not_admin = await cli.run("team", "set-priority-cap", "alpha", "1000", "--token", alpha)
    assert not_admin.returncode == 1 and "403 wrong_role" in not_admin.stderr, not_admin.stderr
    status, body = await cli.get("/api/v1/teams")
    assert status == 200 and isinstance(body, dict) and body["teams"][0]["priority_cap"] == 0
