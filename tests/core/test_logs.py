"""Logs: one pipeline for our events and the libraries', snake_case event names,
the API's access log, each `minions up` child event printed once, agent log files that hold JSON only."""

from __future__ import annotations

import ast
import asyncio
import os
import re
import subprocess
import sys
import textwrap
from typing import Any

import aiohttp

from minions import jsoncodec
from minions.sdk import MinionsClient
from minions.testing.agents import AgentFleet
from minions.testing.factories import make_tokens
from minions.testing.processes import Services
from tests.support.paths import REPO

SNAKE = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}


def _json_lines(text: str) -> list[dict[str, Any]]:
    """Every line as a JSON event; fails on the first line that is not one."""
    events = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            event = jsoncodec.loads(line)
        except ValueError:
            raise AssertionError(f"line {number} is not JSON: {line!r}\n{text[-3000:]}") from None
        assert isinstance(event, dict) and SNAKE.fullmatch(event["event"]), line
        events.append(event)
    return events


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO), **env})


def _is_logger(node: ast.expr) -> bool:
    """`log`, `logger`, `self.log`: the names our modules give their structlog loggers."""
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name in ("log", "logger")


def test_every_event_name_in_the_code_is_snake_case() -> None:
    names: dict[str, str] = {}
    for folder in ("minions", "services", "agents"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in LEVELS
                        and _is_logger(node.func.value)
                        and node.args and isinstance(node.args[0], ast.Constant)
                        and isinstance(node.args[0].value, str)):
                    names[node.args[0].value] = f"{path.relative_to(REPO)}:{node.lineno}"
    assert len(names) > 40, names  # the scan found our log calls
    assert not {name: where for name, where in names.items() if not SNAKE.fullmatch(name)}


def test_library_logs_warnings_and_crashes_are_json_events_of_the_same_pipeline() -> None:
    run = _python("""
        import logging, warnings
        from minions.logging import configure
        configure("api")
        logging.getLogger("aiohttp.server").error(
            "Error handling request to %s", "http://h/api/v1/store/k?method=GET&expires=1&sig=0123abcd")
        logging.getLogger("asyncpg.pool").debug("below the level: not shown")
        warnings.warn("a deprecated call", DeprecationWarning, stacklevel=1)
        raise RuntimeError("the end")
    """, PYTHONWARNINGS="always")
    assert run.returncode == 1
    events = {e["event"]: e for e in _json_lines(run.stderr)}
    assert set(events) == {"aiohttp_server", "py_warnings", "unhandled_exception"}, run.stderr
    assert events["aiohttp_server"]["level"] == "error" and events["aiohttp_server"]["service"] == "api"
    assert "sig=[redacted]" in events["aiohttp_server"]["message"] and "0123abcd" not in run.stderr
    assert "RuntimeError: the end" in events["unhandled_exception"]["exception"]


def test_minions_up_shows_each_child_exit_once() -> None:
    run = _python("""
        import asyncio, tempfile
        from pathlib import Path
        from minions.cli.supervisor import Supervisor
        from minions.logging import configure

        async def main():
            with tempfile.TemporaryDirectory() as folder:
                supervisor = Supervisor(Path(folder))
                child = await supervisor.start("zen", "this", [], {})  # prints and exits at once
                while child.restarts < 2:
                    await asyncio.sleep(0.05)
                await supervisor.stop()
                print(child.restarts)

        configure("up", for_terminal=True)
        asyncio.run(main())
    """)
    assert run.returncode == 0, run.stderr
    restarts = int(run.stdout.split()[-1])
    exits = [e for e in _json_lines(run.stderr) if e["event"] == "child_exited"]
    assert len(exits) == restarts and all(e["child"] == "zen" for e in exits), run.stderr


async def test_the_access_log_is_one_json_line_per_request_without_secrets(services: Services) -> None:
    await services.start_all()
    admin, _ = await make_tokens(services.database_url)
    async with aiohttp.ClientSession() as session:
        for path in ("/api/v1/health", "/api/v1/tasks?limit=3", "/api/v1/store/x.jsonl?method=GET&expires=9&sig=feed"):
            async with session.get(services.api_url + path, headers={"Authorization": f"Bearer {admin}"}) as resp:
                await resp.read()
    api = services.running["api"]
    await asyncio.sleep(0.5)
    requests = [e for e in _json_lines(api.log()) if e["event"] == "http_request"]
    assert [(e["method"], e["path"], e["status"]) for e in requests][-3:] == [
        ("GET", "/api/v1/health", 200), ("GET", "/api/v1/tasks?limit=3", 200),
        ("GET", "/api/v1/store/x.jsonl?method=GET&expires=9&sig=[redacted]", 403)]
    assert admin not in api.log() and "feed" not in api.log()


async def test_an_agents_log_file_holds_json_only(services: Services) -> None:
    await services.start_all()
    admin, executor_token = await make_tokens(services.database_url)
    fleet = AgentFleet(services, executor_token)
    agent = fleet.start("json-only")
    try:
        async with MinionsClient(services.api_url, admin) as client:
            task = await client.submit([{"id": 1, "ms": 1}], team="search", project="logs", name="t", kind="sleep")
            assert (await client.wait(task, timeout_s=60)).status == "completed"
    finally:
        fleet.stop_all()
    events = _json_lines(agent.log())
    assert {"agent_ready", "subtask_completed", "agent_stopped"} <= {e["event"] for e in events}
