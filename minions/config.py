"""The one configuration loader: environment variables (API.md's table), each also a CLI flag.

Every process builds a `Settings` from the environment, then lets its command-line flags override
fields (`add_arguments` + `from_args`), so `MINIONS_LEASE_TIMEOUT_S=2` and `--lease-timeout-s 2`
mean the same thing everywhere.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A setting has a value that cannot work; the message names the variable."""


@dataclass(frozen=True)
class Settings:
    database_url: str = field(default="", metadata={"env": "MINIONS_DATABASE_URL",
                                                    "help": "PostgreSQL URL of the services"})
    store: str = field(default="", metadata={"env": "MINIONS_STORE",
                                             "help": "object store: s3://bucket/prefix or file:///path"})
    s3_endpoint_url: str = field(default="", metadata={"env": "MINIONS_S3_ENDPOINT_URL",
                                                       "help": "endpoint of an S3-compatible store"})
    admin_token: str = field(default="", metadata={"env": "MINIONS_ADMIN_TOKEN",
                                                   "help": "admin token that `minions up` installs"})
    api_url: str = field(default="http://127.0.0.1:8080", metadata={"env": "MINIONS_API_URL",
                                                                    "help": "where clients connect"})
    token: str = field(default="", metadata={"env": "MINIONS_TOKEN", "help": "bearer token of clients"})
    heartbeat_interval_s: float = field(default=30.0, metadata={"env": "MINIONS_HEARTBEAT_INTERVAL_S",
                                                                "help": "executor heartbeat period"})
    lease_timeout_s: float = field(default=120.0, metadata={"env": "MINIONS_LEASE_TIMEOUT_S",
                                                            "help": "silence before the watchdog reclaims"})
    max_attempts: int = field(default=3, metadata={"env": "MINIONS_MAX_ATTEMPTS",
                                                   "help": "attempts before a subtask fails for good"})
    long_poll_s: float = field(default=30.0, metadata={"env": "MINIONS_LONG_POLL_S",
                                                       "help": "longest a claim waits"})
    host: str = field(default="127.0.0.1", metadata={"env": "MINIONS_HOST", "help": "API bind address"})
    port: int = field(default=8080, metadata={"env": "MINIONS_PORT", "help": "API port"})
    public_url: str = field(default="", metadata={"env": "MINIONS_PUBLIC_URL",
                                                  "help": "API URL as executors reach it (signed store URLs)"})
    straggler_factor: float = field(default=4.0, metadata={"env": "MINIONS_STRAGGLER_FACTOR",
                                                           "help": "back up a lease running this many times the "
                                                                   "median (0: never)"})
    sweep_interval_s: float = field(default=10.0, metadata={"env": "MINIONS_SWEEP_INTERVAL_S",
                                                            "help": "watchdog/splitter safety-net sweep period"})
    listen_probe_s: float = field(default=30.0, metadata={"env": "MINIONS_LISTEN_PROBE_S",
                                                          "help": "liveness probe period of each LISTEN connection"})
    max_input_bytes: int = field(default=2 * 1024**3, metadata={"env": "MINIONS_MAX_INPUT_BYTES",
                                                                "help": "largest POST /api/v1/inputs body"})
    max_output_bytes: int = field(default=256 * 1024**2, metadata={"env": "MINIONS_MAX_OUTPUT_BYTES",
                                                                   "help": "largest output PUT to a local-store URL"})
    team_input_quota_bytes: int = field(default=20 * 1024**3, metadata={
        "env": "MINIONS_TEAM_INPUT_QUOTA_BYTES", "help": "input bytes a team may store (0: no quota)"})
    gc_grace_s: float = field(default=3600.0, metadata={"env": "MINIONS_GC_GRACE_S",
                                                        "help": "age before unreferenced objects are garbage"})
    gc_interval_s: float = field(default=600.0, metadata={"env": "MINIONS_GC_INTERVAL_S",
                                                          "help": "watchdog's garbage-collection period (0: off)"})
    compact_interval_s: float = field(default=5.0, metadata={"env": "MINIONS_COMPACT_INTERVAL_S",
                                                             "help": "watchdog's period for compacting completed "
                                                                     "tasks' results into parts (0: off)"})
    result_part_bytes: int = field(default=64 * 1024**2, metadata={"env": "MINIONS_RESULT_PART_BYTES",
                                                                   "help": "size a compacted result part grows to"})

    # Slow clients (services/api/slow_clients.py): a slowloris cannot pin the API's sockets.
    header_timeout_s: float = field(default=10.0, metadata={"env": "MINIONS_HEADER_TIMEOUT_S",
                                                            "help": "a new connection's request headers must "
                                                                    "arrive within this"})
    body_timeout_s: float = field(default=30.0, metadata={"env": "MINIONS_BODY_TIMEOUT_S",
                                                          "help": "grace before a request body must arrive at "
                                                                  "MINIONS_BODY_MIN_RATE (else 408)"})
    body_min_rate: float = field(default=1024.0, metadata={"env": "MINIONS_BODY_MIN_RATE",
                                                           "help": "slowest request body accepted, bytes/s"})
    max_connections_per_ip: int = field(default=256, metadata={"env": "MINIONS_MAX_CONNECTIONS_PER_IP",
                                                               "help": "open connections one address may hold "
                                                                       "(more: 429)"})

    def validate(self) -> Settings:
        problems = []
        for name in ("heartbeat_interval_s", "lease_timeout_s", "long_poll_s", "sweep_interval_s", "listen_probe_s",
                     "header_timeout_s", "body_timeout_s", "body_min_rate", "max_connections_per_ip"):
            if getattr(self, name) <= 0:
                problems.append(f"{_env(name)} must be > 0")
        if self.straggler_factor < 0:
            problems.append("MINIONS_STRAGGLER_FACTOR must be >= 0 (0 turns backups off)")
        for name in ("max_input_bytes", "max_output_bytes", "result_part_bytes"):
            if getattr(self, name) <= 0:
                problems.append(f"{_env(name)} must be > 0")
        for name in ("team_input_quota_bytes", "gc_grace_s", "gc_interval_s", "compact_interval_s"):
            if getattr(self, name) < 0:
                problems.append(f"{_env(name)} must be >= 0")
        if self.max_attempts < 1:
            problems.append("MINIONS_MAX_ATTEMPTS must be >= 1")
        if self.lease_timeout_s <= self.heartbeat_interval_s:
            problems.append("MINIONS_LEASE_TIMEOUT_S must exceed MINIONS_HEARTBEAT_INTERVAL_S")
        if problems:
            raise ConfigError("; ".join(problems))
        return self

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    @property
    def url_for_executors(self) -> str:
        """Base URL that signed local-store URLs point at."""
        return (self.public_url or f"http://{_url_host(self.host)}:{self.port}").rstrip("/")


def _url_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "") else host


def _env(field_name: str) -> str:
    for f in dataclasses.fields(Settings):
        if f.name == field_name:
            return str(f.metadata["env"])
    raise KeyError(field_name)


def _convert(f: dataclasses.Field[Any], raw: str) -> Any:
    kind = f.type if isinstance(f.type, type) else {"float": float, "int": int, "str": str}[str(f.type)]
    try:
        return kind(raw)
    except ValueError as exc:
        raise ConfigError(f"{f.metadata['env']}={raw!r} is not a valid {kind.__name__}") from exc


def from_env(environ: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Settings):
        raw = env.get(f.metadata["env"])
        if raw not in (None, ""):
            values[f.name] = _convert(f, raw)
    return Settings(**values)


def add_arguments(parser: argparse.ArgumentParser, names: tuple[str, ...]) -> None:
    """Add `--database-url`-style flags for the named settings (defaults come from the environment)."""
    by_name = {f.name: f for f in dataclasses.fields(Settings)}
    for name in names:
        f = by_name[name]
        parser.add_argument(
            "--" + name.replace("_", "-"), dest=f"setting_{name}", default=None, metavar=name.upper(),
            help=f"{f.metadata['help']} (env {f.metadata['env']})",
        )


def from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Settings:
    settings = from_env(environ)
    by_name = {f.name: f for f in dataclasses.fields(Settings)}
    changes = {
        key.removeprefix("setting_"): _convert(by_name[key.removeprefix("setting_")], value)
        for key, value in vars(args).items()
        if key.startswith("setting_") and value is not None
    }
    return settings.replace(**changes).validate()
