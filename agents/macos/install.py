"""`minions agent install`: run the agent at login as a launchd LaunchAgent (macOS) or a systemd
user unit (Linux), from a config file that holds the resolved settings (token included, mode 600,
so the token is not written into a world-readable unit file)."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from dataclasses import dataclass, replace
from importlib.resources import files
from pathlib import Path
from string import Template
from xml.sax.saxutils import escape

from minions.agents.macos.config import AgentConfig, config_home, default_config_path, to_toml
from minions.private_files import DIR_MODE, make_private_dir, tighten

LABEL = "com.minions.agent"
PROCESS_TYPES = ("Adaptive", "Standard")
# Package data (the package `minions.infra` is the repository's `infra/`), read through importlib.resources.
_INFRA = files("minions.infra")
LAUNCHD_TEMPLATE = _INFRA / "launchd" / f"{LABEL}.plist.template"
SYSTEMD_TEMPLATE = _INFRA / "systemd" / "minions-agent.service.template"
SYSTEMD_UNIT = "minions-agent.service"


@dataclass(frozen=True)
class InstallPlan:
    """What `install` writes: each file's path, content and mode, and the command to run after."""

    files: tuple[tuple[Path, str, int], ...]
    activate: tuple[str, ...] | None  # None: print the hint instead
    hint: str


def agent_command(config_path: Path) -> list[str]:
    """The agent's command line: this interpreter, so the unit uses the same environment."""
    return [sys.executable, "-m", "minions.agents.macos", "--config", str(config_path)]


def working_directory() -> Path:
    # The agent is an installed package (`python -m minions.agents.macos` finds it from anywhere):
    # any folder will do, and the user's home always exists.
    return Path.home()


def render_launchd(config_path: Path, process_type: str = "Adaptive", home: Path | None = None) -> str:
    if process_type not in PROCESS_TYPES:
        raise ValueError(f"process type must be one of {', '.join(PROCESS_TYPES)}")
    log_dir = (home or Path.home()) / "Library" / "Logs" / "minions"
    arguments = "\n".join(f"    <string>{escape(a)}</string>" for a in agent_command(config_path))
    return Template(LAUNCHD_TEMPLATE.read_text(encoding="utf-8")).substitute(
        label=LABEL,
        program_arguments=arguments,
        working_directory=escape(str(working_directory())),
        process_type=process_type,
        log_dir=escape(str(log_dir)),
    )


def render_systemd(config_path: Path) -> str:
    return Template(SYSTEMD_TEMPLATE.read_text(encoding="utf-8")).substitute(
        working_directory=str(working_directory()),
        # systemd expands % specifiers in ExecStart: a literal % is written %%.
        exec_start=shlex.join(agent_command(config_path)).replace("%", "%%"),
    )


def plan(
    config: AgentConfig,
    *,
    system: str | None = None,
    home: Path | None = None,
    process_type: str = "Adaptive",
) -> InstallPlan:
    home = home or Path.home()
    config_path = default_config_path(home)
    config_file = (config_path, to_toml(config), 0o600)
    if (system or platform.system()) == "Darwin":
        plist = home / "Library" / "LaunchAgents" / f"{LABEL}.plist"
        return InstallPlan(
            files=(config_file, (plist, render_launchd(config_path, process_type, home), 0o644)),
            activate=("launchctl", "load", "-w", str(plist)),
            hint=f"The agent starts at login; logs: {home}/Library/Logs/minions/. Stop it with "
            f"`launchctl unload -w {plist}`.",
        )
    unit = config_home(home) / "systemd" / "user" / SYSTEMD_UNIT
    return InstallPlan(
        files=(config_file, (unit, render_systemd(config_path), 0o644)),
        activate=None,
        hint="Enable it with:\n"
        f"  systemctl --user daemon-reload && systemctl --user enable --now {SYSTEMD_UNIT}\n"
        f"  loginctl enable-linger {os.environ.get('USER', '$USER')}   # to run while logged out\n"
        f"Logs: journalctl --user -u {SYSTEMD_UNIT} -f",
    )


def install(config: AgentConfig, *, dry_run: bool = False, process_type: str = "Adaptive") -> int:
    steps = plan(config, process_type=process_type)
    if dry_run:
        for path, content, _ in steps.files:
            shown = to_toml(replace(config, token="<redacted>")) if path.suffix == ".toml" else content
            print(f"# {path}\n{shown}")
        if steps.activate:
            print(f"# then: {shlex.join(steps.activate)}")
        print(steps.hint)
        return 0
    for path, content, mode in steps.files:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Created with its final mode, so the token is never readable by others, not even briefly.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w") as f:
            f.write(content)
        os.chmod(path, mode)
        print(f"wrote {path}")
    if steps.activate:
        # launchd creates the log files in here with the plist's Umask (owner-only); the folder too.
        log_dir = Path.home() / "Library" / "Logs" / "minions"
        make_private_dir(log_dir)
        tighten(log_dir, DIR_MODE)
        # Unload first so that a re-install picks up the new file; it fails harmlessly the first time.
        subprocess.run(["launchctl", "unload", steps.activate[-1]], capture_output=True, check=False)
        result = subprocess.run(list(steps.activate), check=False)
        if result.returncode != 0:
            print(f"`{shlex.join(steps.activate)}` failed ({result.returncode})", file=sys.stderr)
            return 1
    print(steps.hint)
    return 0
