"""`minions agent` (run the executor agent) and `minions agent install`.

The `minions` CLI calls `add_parser(subparsers)` and, for the `agent` command, `run(args)` (its handler);
`python -m minions.agents.macos` calls `main()`, which goes through the same two functions.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from minions import runtime
from minions.agents.macos import config as agent_config
from minions.agents.macos.install import PROCESS_TYPES


def add_parser(subparsers: Any) -> None:
    """Add `agent` (and `agent install`) to the `minions` CLI's subparsers."""
    parser = subparsers.add_parser(
        "agent",
        help="run the executor agent on this machine",
        description="Serve embedding/completion subtasks from a Minions API while this machine is idle.",
    )
    agent_config.add_arguments(parser)
    commands = parser.add_subparsers(dest="agent_command", metavar="{install}")
    install = commands.add_parser(
        "install",
        help="start the agent at login (launchd on macOS, systemd --user on Linux)",
        description="Write the agent's config file and a LaunchAgent plist (macOS) or a systemd user "
        "unit (Linux) that runs it.",
    )
    agent_config.add_arguments(install)
    install.add_argument("--dry-run", action="store_true", help="print the files instead of writing them")
    install.add_argument(
        "--process-type",
        choices=PROCESS_TYPES,
        default="Adaptive",
        help="launchd ProcessType (default Adaptive)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the parsed `agent` command; the process exit status."""
    from minions.logging import configure, get_logger

    installing = getattr(args, "agent_command", None) == "install"
    if not installing:  # the agent's log (a file under launchd/systemd/`minions up`) holds JSON only
        configure("agent", for_terminal=True)
    try:
        config = agent_config.from_args(args)
    except agent_config.AgentConfigError as exc:
        if installing:
            print(f"minions agent: {exc}")
        else:
            get_logger(__name__).error("config_invalid", error=str(exc))
        return 78  # EX_CONFIG, as for a refused token
    if installing:
        from minions.agents.macos import install

        return install.install(config, dry_run=args.dry_run, process_type=args.process_type)
    from minions.agents.macos.serve import serve

    return runtime.run(serve(config))


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m minions.agents.macos [flags]` and `python -m minions.agents.macos install [flags]`."""
    import sys

    parser = argparse.ArgumentParser(prog="python -m minions.agents.macos")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["agent", *(sys.argv[1:] if argv is None else argv)])
    return run(args)
