"""Several replicas of every service behind a real HAProxy, for the replica drill.

HAProxy runs the shipped config (infra/haproxy/haproxy.cfg, read through importlib.resources as
an installed package would) with its variables set for this machine: the balancer on a free port,
three API replicas on theirs. Every service and agent is given the balancer's URL; only the drill
itself talks to one replica directly, to prove work crosses replicas.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from importlib.resources import as_file, files
from pathlib import Path

from minions.embedded_pg import free_port
from minions.sdk.health import wait_until_healthy
from minions.testing.processes import IMPORT_ROOT, ManagedProcess, Service, Services

HAPROXY = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)
# Long enough that a claim woken by the long-poll timer cannot pass for one woken by a NOTIFY.
LONG_POLL_S = 20.0
MISSING = ("HAProxy is not installed: the replica drill needs Debian's package "
           "(`apt-get install -y haproxy`; .ci/run installs it)")


@dataclass
class Balancer(ManagedProcess):
    """`haproxy -db -f infra/haproxy/haproxy.cfg` in the foreground, as a child of the test."""

    port: int
    backends: list[int]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> Balancer:
        assert HAPROXY, MISSING
        env = {**os.environ, "MINIONS_LB_BIND": f"127.0.0.1:{self.port}",
               **{f"MINIONS_API_{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(self.backends)}}
        with as_file(files("minions.infra") / "haproxy" / "haproxy.cfg") as cfg, self.log_path.open("ab") as log:
            self.process = subprocess.Popen([HAPROXY, "-db", "-f", str(cfg)], env=env, cwd=IMPORT_ROOT,
                                            stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        return self


@dataclass
class ReplicatedServices(Services):
    """`replicas` of each service; the API's behind the balancer, whose URL is `api_url`.

    Services are named `api-1`, `splitter-2`, ...; `port` (inherited) is the balancer's port."""

    replicas: dict[str, int] = field(default_factory=lambda: {"api": 3, "splitter": 2, "watchdog": 2})
    api_ports: list[int] = field(default_factory=list)
    balancer: Balancer | None = None
    start_timeout_s: float = 30.0  # longer for a bench on a loaded host: 7 Python services start at once

    def __post_init__(self) -> None:
        self.api_ports = [free_port() for _ in range(self.replicas["api"])]
        self.extra_env = {"MINIONS_PUBLIC_URL": self.api_url, **self.extra_env}

    def replica_url(self, index: int) -> str:
        """The URL of API replica `index` (1-based), bypassing the balancer."""
        return f"http://127.0.0.1:{self.api_ports[index - 1]}"

    def start(self, name: str) -> Service:
        kind, _, index = name.partition("-")
        self.apply_cluster_settings()  # the lease timeout the drill expects, in the database
        env = self.env()
        if kind == "api":
            env["MINIONS_PORT"] = str(self.api_ports[int(index) - 1])
        service = Service(name, f"minions.services.{kind}", env, self.workdir / f"{name}.log").start()
        self.running[name] = service
        return service

    async def start_all(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.balancer = Balancer(self.port, self.api_ports, self.workdir / "haproxy.log").start()
        for kind, count in self.replicas.items():
            for i in range(1, count + 1):
                self.start(f"{kind}-{i}")
        for i in range(1, self.replicas["api"] + 1):
            if not await wait_until_healthy(self.replica_url(i), self.start_timeout_s):
                raise AssertionError(f"api-{i} never became healthy:\n{self.running[f'api-{i}'].log()[-3000:]}")
        await self.wait_healthy()

    async def wait_healthy(self, timeout: float = 30) -> None:
        """Healthy through the balancer; else what HAProxy said (a port another process took between
        free_port() and its bind, most often), not the single-API log this class does not have."""
        if not await wait_until_healthy(self.api_url, timeout):
            raise AssertionError(f"the API never became healthy through HAProxy:\n{self.logs()[-3000:]}")

    def stop_all(self) -> None:
        super().stop_all()
        if self.balancer:
            self.balancer.kill()

    def logs(self) -> str:
        balancer = self.balancer.log()[-2000:] if self.balancer else ""
        return f"{super().logs()}\n--- haproxy ---\n{balancer}"
