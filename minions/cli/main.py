"""The `minions` command.

Each subcommand's module is imported only when that subcommand runs: `minions --help` and
`minions --version` import nothing but argparse, so they answer at once, and `minions status` never
loads the agent's inference stack or the embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Not `from typing import ...`: typing alone costs ~20 ms of `minions --help` (mypy reads the name).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Subcommand -> (the module whose `add_parsers(sub)` defines it, its one-line help for `minions --help`).
# A module defines all of its subcommands at once; a subcommand missing here still works (the full
# parser is built for it) but is not listed by `minions --help`.
COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("minions.cli.up", "run everything locally: database, store, services, agents"),
    "submit": ("minions.cli.tasks", "submit a task from a JSONL file"),
    "status": ("minions.cli.tasks", "tasks as a table, or one task (TEAM/PROJECT/NAME)"),
    "wait": ("minions.cli.tasks", "wait for a task with a progress bar, then summarise it"),
    "results": ("minions.cli.tasks", "download a task's results (JSONL, input order)"),
    "cancel": ("minions.cli.tasks", "cancel a task"),
    "retry": ("minions.cli.tasks", "run a failed task's failed subtasks again (its results so far stay)"),
    "executors": ("minions.cli.tasks", "executors as a table, with the models each serves"),
    "executor": ("minions.cli.tasks", "one executor: executor release ID lifts its quarantine (admin)"),
    "env": ("minions.cli.env", "print the export lines that point clients at the running `minions up`"),
    "usage": ("minions.cli.usage", "compute used per team, given per executor or owner"),
    "verify": ("minions.cli.verify", "run a finished task's suspect results again and report what changed"),
    "agent": ("minions.agents.macos.cli", "run the executor agent on this machine (or `agent install`)"),
    "db": ("minions.cli.admin", "database operations (db migrate)"),
    "settings": ("minions.cli.cluster", "cluster-wide settings kept in the database (settings show, set)"),
    "token": ("minions.cli.admin", "API tokens (token create, list, revoke)"),
    "delete": ("minions.cli.storage", "delete a finished task (its input and results are then garbage)"),
    "gc": ("minions.cli.storage", "delete garbage from the object store (--dry-run says what first)"),
    "compact": ("minions.cli.compact", "compact completed tasks' results into large parts now"),
    "team": ("minions.cli.storage", "team settings: shares of the pool (team shares, set-weight, "
                                    "set-priority-cap, set-max-leases), allowed inputs (allow-input, inputs)"),
    "logs": ("minions.cli.logs", "show the logs of a local `minions up` (-f follows them)"),
    "psql": ("minions.cli.admin", "psql on the database; arguments after it pass through (-c \"...\")"),
}
SERVICES = {
    "api": "minions.services.api.main",
    "splitter": "minions.services.splitter.main",
    "watchdog": "minions.services.watchdog.main",
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every flag's help says its default, when it has one worth saying."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (default in (None, False, argparse.SUPPRESS) or default == [] or "default" in text
                or not action.option_strings or action.nargs == 0):
            return text
        return f"{text} (default: {default})"


class Parser(argparse.ArgumentParser):
    """The parser class of every (sub)command: the formatter above unless one is given."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


class VersionAction(argparse.Action):
    """`--version`, read from the installed distribution only when asked."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"minions {version()}")
        parser.exit()


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("minions")
    except PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
        return "0+unknown"


def _add_module(sub: argparse._SubParsersAction[argparse.ArgumentParser], module_name: str) -> None:
    module = importlib.import_module(module_name)
    add = getattr(module, "add_parsers", None) or module.add_parser
    add(sub)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with `command`'s module loaded, the other commands as one-line entries only;
    `command` "*" loads every module (what the tests of the flags walk)."""
    parser = Parser(prog="minions", description="Batch inference on idle machines.")
    parser.add_argument("--version", action=VersionAction)
    sub: argparse._SubParsersAction[argparse.ArgumentParser] = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=Parser)
    if command == "*":
        modules = list(dict.fromkeys(m for m, _ in COMMANDS.values()))
    elif command in COMMANDS:
        modules = [COMMANDS[command][0]]
    elif command is not None and command not in SERVICES and not command.startswith("-"):
        # Not in the table (a command added without an entry): every module, so it is found.
        modules = list(dict.fromkeys(m for m, _ in COMMANDS.values()))
    else:
        modules = []
    for module_name in modules:
        try:
            _add_module(sub, module_name)
        except ImportError as exc:  # the agent is an optional install
            if not module_name.startswith("minions.agents"):
                raise
            if command == "agent":
                raise SystemExit(f"minions agent: the agent is not installed ({exc}); "
                                 "pip install 'minions[agent]'") from None
    for name, (_, text) in COMMANDS.items():
        if name not in sub.choices:
            sub.add_parser(name, help=text, add_help=False)
    for name in SERVICES:
        sub.add_parser(name, help=f"run the {name} service alone (production); `minions {name} --help` for "
                                  "its flags", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in SERVICES:
        # Each service owns its flags; hand the rest of the line to it.
        module = importlib.import_module(SERVICES[argv[0]])
        result: int = module.main(argv[1:])
        return result
    parser = build_parser(argv[0] if argv else None)
    if argv and argv[0] == "psql":
        # Everything that is not one of our flags is psql's, in order: `minions psql -c "..." -A`.
        args, extra = parser.parse_known_args(argv)
        args.psql_args = [*extra, *args.psql_args]
    else:
        args = parser.parse_args(argv)
    # Every command, client or server or the agent, sets one handler: the parsed args -> exit status.
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
