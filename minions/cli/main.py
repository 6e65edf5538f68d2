"""The `minions` command."""

from __future__ import annotations

import argparse
import sys

from minions.cli import admin, storage, tasks, up

SERVICES = {
    "api": "minions.services.api.main",
    "splitter": "minions.services.splitter.main",
    "watchdog": "minions.services.watchdog.main",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minions", description="Batch inference on idle machines.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    up.add_parser(sub)
    for name in SERVICES:
        sub.add_parser(name, help=f"run the {name} service alone (production); --help for its flags",
                       add_help=False)
    admin.add_parsers(sub)
    storage.add_parsers(sub)
    tasks.add_parsers(sub)
    try:
        from minions.agents.macos.cli import add_parser as add_agent_parser
    except ImportError:  # the agent is an optional install
        pass
    else:
        add_agent_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in SERVICES:
        # Each service owns its flags; hand the rest of the line to it.
        module = __import__(SERVICES[argv[0]], fromlist=["main"])
        result: int = module.main(argv[1:])
        return result
    args = build_parser().parse_args(argv)
    if args.command in ("submit", "status", "wait", "results", "cancel", "executors", "delete"):
        return tasks.run(args)
    if args.command == "agent":
        from minions.agents.macos.cli import run as run_agent

        return run_agent(args)
    handler = args.handler
    code: int = handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
