"""`minions env` prints the export lines of the running `minions up` (read from its up.json, once its
API answers), for `eval "$(minions env)"`; with no `minions up`, or one that no longer answers, it says
so on stderr, prints nothing to eval, and exits 1."""

from __future__ import annotations

import socket

from minions import jsoncodec
from tests.cli.conftest import Cli


def _write_up_json(cli: Cli, api_url: str) -> None:
    folder = cli.cwd / ".minions"
    folder.mkdir(exist_ok=True)
    (folder / "up.json").write_bytes(jsoncodec.dumps({"api_url": api_url, "admin_token": cli.admin}))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_env_prints_the_running_instances_exports(cli: Cli) -> None:
    missing = await cli.run("env")
    assert missing.returncode == 1 and missing.stdout == ""
    assert "no `minions up` found" in missing.stderr and "up.json" in missing.stderr

    _write_up_json(cli, cli.services.api_url)
    printed = await cli.run("env")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == f"export MINIONS_API_URL={cli.services.api_url}\nexport MINIONS_TOKEN={cli.admin}\n"
    both = await cli.run("env", "--openai")
    assert both.stdout.splitlines()[2:] == [f"export OPENAI_BASE_URL={cli.services.api_url}/v1",
                                            f"export OPENAI_API_KEY={cli.admin}"]

    # As README says to use it: the shell gets the variables, and a client command then finds the API.
    shell = await cli.shell('unset MINIONS_API_URL MINIONS_TOKEN; eval "$($MINIONS env)" && '
                            'echo "$MINIONS_API_URL $MINIONS_TOKEN" && $MINIONS status --json')
    assert shell.returncode == 0, shell.stderr
    first, rest = shell.stdout.split("\n", 1)
    assert first == f"{cli.services.api_url} {cli.admin}"
    assert jsoncodec.loads(rest)["tasks"] == []

    # An up.json left by a `minions up` that stopped: nothing to eval.
    stale = f"http://127.0.0.1:{_closed_port()}"
    _write_up_json(cli, stale)
    gone = await cli.run("env")
    assert gone.returncode == 1 and gone.stdout == ""
    assert f"does not answer at {stale}" in gone.stderr
