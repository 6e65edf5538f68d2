"""Real agent processes (`python -m minions.agents.macos`) against real services, for end-to-end and chaos
tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from minions.testing.processes import IMPORT_ROOT, ManagedProcess, Services, stop_together


@dataclass
class AgentProcess(ManagedProcess):
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path


@dataclass
class AgentFleet:
    services: Services
    token: str
    agents: list[AgentProcess] = field(default_factory=list)
    # The checkout the agents run from: this one, or another revision's (bench/revision.py), to
    # compare an older agent with this one against the same services.
    root: Path = IMPORT_ROOT

    def start(self, name: str, *extra: str, kinds: tuple[str, ...] = ("sleep",),
              env: Mapping[str, str] | None = None) -> AgentProcess:
        """An agent process; `env`: variables of its own (e.g. its own Hugging Face cache)."""
        args = [sys.executable, "-m", "minions.agents.macos", "--api-url", self.services.api_url, "--token", self.token,
                "--name", name, "--no-idle-check", "--no-ac-check", "--no-thermal-check"]
        for kind in kinds:
            args += ["--kind", kind]
        log_path = self.services.workdir / f"agent-{name}.log"
        with log_path.open("ab") as log:
            environ = {**os.environ, "PYTHONUNBUFFERED": "1", "MINIONS_LOG_LEVEL": "info", **(env or {})}
            environ.pop("MINIONS_TOKEN", None)
            if self.root != IMPORT_ROOT:
                environ["PYTHONPATH"] = str(self.root)
            process = subprocess.Popen([*args, *extra], cwd=self.root, env=environ, stdout=log, stderr=log,
                                       stdin=subprocess.DEVNULL)
        agent = AgentProcess(name, process, log_path)
        self.agents.append(agent)
        return agent

    def stop_all(self) -> None:
        stop_together(self.agents)

    def logs(self) -> str:
        return "\n".join(f"--- agent {a.name} ---\n{a.log()[-3000:]}" for a in self.agents)
