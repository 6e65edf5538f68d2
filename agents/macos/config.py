"""The agent's configuration: defaults < TOML file < environment < command-line flags.

The TOML file (`--config`, default $XDG_CONFIG_HOME/minions/agent.toml, else
~/.config/minions/agent.toml, when it exists) uses the same names as the dataclass fields;
preferences use the `--prefer` syntax, policy toggles sit under [policy]:

    api_url = "https://minions.example.com"
    token = "..."
    kinds = ["embedding", "sleep"]
    prefer = ["search/ranker"]
    [policy]
    idle_minutes = 5
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minions import config as minions_config
from minions import jsoncodec
from minions.agents.macos.runners import mlx_setup
from minions.agents.macos.runners.precision import PRECISION_SETTINGS
from minions.kinds import KINDS
from minions.names import is_name

COMPLETION_BACKENDS = ("ollama", "transformers")
# The engine models run on (runners/backend_choice.py): auto measures torch against MLX on Apple
# silicon and keeps torch elsewhere; ollama sends completions to Ollama (embeddings stay on torch).
BACKENDS = ("auto", "torch", "mlx", "ollama")
DEFAULT_CONFIG_PATH = Path("~/.config/minions/agent.toml")  # where XDG_CONFIG_HOME is unset


def config_home(home: Path | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """$XDG_CONFIG_HOME (the XDG base-directory rule: used when absolute), else ~/.config; on Linux
    and macOS alike, so the agent's file is where a Unix user looks for it."""
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_CONFIG_HOME", "")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg)
    return (home or Path.home()) / ".config"


def default_config_path(home: Path | None = None, environ: Mapping[str, str] | None = None) -> Path:
    return config_home(home, environ) / "minions" / "agent.toml"
DEFAULT_OLLAMA_HOST = "http://127.0.0.1:11434"


class AgentConfigError(ValueError):
    """A setting cannot work; the message says which and why."""


@dataclass(frozen=True)
class Preference:
    """Dynamic task binding: work of this team (and project, and task) first."""

    team: str
    project: str | None = None
    task_name: str | None = None

    def to_json(self) -> dict[str, str | None]:
        return {"team": self.team, "project": self.project, "task_name": self.task_name}

    def __str__(self) -> str:
        return "/".join(p for p in (self.team, self.project, self.task_name) if p is not None)


@dataclass(frozen=True)
class PolicyConfig:
    """Owner policy; each check is off when disabled (idle_minutes 0, max_load None)."""

    idle_minutes: float = 5.0
    require_ac_power: bool = True
    avoid_thermal_pressure: bool = True
    max_load: float | None = None  # Linux: 1-minute load average above which no new work is taken

    def describe(self) -> str:
        parts = []
        if self.idle_minutes > 0:
            parts.append(f"user idle >= {self.idle_minutes:g} min")
        if self.require_ac_power:
            parts.append("on AC power")
        if self.avoid_thermal_pressure:
            parts.append("no thermal pressure")
        if self.max_load is not None:
            parts.append(f"load average <= {self.max_load:g}")
        return ", ".join(parts) or "always available"


@dataclass(frozen=True)
class AgentConfig:
    api_url: str = "http://127.0.0.1:8080"
    token: str = ""
    name: str = field(default_factory=socket.gethostname)
    kinds: tuple[str, ...] = KINDS
    models: tuple[str, ...] = ()
    preferences: tuple[Preference, ...] = ()
    policy: PolicyConfig = PolicyConfig()
    ollama_host: str = DEFAULT_OLLAMA_HOST
    allow_pull: bool = False
    # Unified memory is the owner's too: by default torch may take at most half of it on MPS.
    mps_memory_fraction: float = 0.5
    completion_backend: str = "ollama"
    threads: int | None = None  # torch intra-op threads; None keeps torch's default
    device: str | None = None  # None: mps, then cuda, then cpu
    precision: str = "auto"  # embeddings: the fastest precision within min_cosine of fp32
    backend: str = "auto"  # auto, torch, mlx or ollama (see BACKENDS)
    min_cosine: float = 0.9999
    generation_batch_size: int | None = None  # transformers completions; None: the device's default
    # Requests in flight per subtask: as many as Ollama has slots. OLLAMA_NUM_PARALLEL sets them
    # when the agent shares Ollama's environment (the usual case); 1 is Ollama's own default.
    ollama_parallel: int = 1
    # Leases held at once (the pipeline: one computing, the next ones claimed and fetched); what a
    # vanishing machine strands until the lease timeout. None: as deep as the subtasks' measured
    # duration calls for (claim_depth.py: 2 for long ones, deeper for short ones).
    max_leases: int | None = None

    def validate(self) -> AgentConfig:
        problems = []
        if not self.token:
            problems.append("no token: set MINIONS_TOKEN or pass --token (an executor token)")
        if not self.kinds:
            problems.append("kinds: at least one kind is needed")
        if bad := [k for k in self.kinds if k not in KINDS]:
            problems.append(f"kinds: unknown {', '.join(bad)} (known: {', '.join(KINDS)})")
        if self.completion_backend not in COMPLETION_BACKENDS:
            problems.append(f"completion_backend must be one of {', '.join(COMPLETION_BACKENDS)}")
        if not 0 < self.mps_memory_fraction <= 1:
            problems.append("mps_memory_fraction must be in (0, 1]")
        if self.threads is not None and self.threads < 1:
            problems.append("threads must be >= 1")
        if self.device not in (None, "mps", "cuda", "cpu"):
            problems.append("device must be mps, cuda or cpu")
        if self.backend not in BACKENDS:
            problems.append(f"backend must be one of {', '.join(BACKENDS)}")
        elif self.backend == "mlx" and not mlx_setup.available():
            problems.append(f"backend mlx {mlx_setup.MISSING}")
        if self.precision not in PRECISION_SETTINGS:
            problems.append(f"precision must be one of {', '.join(PRECISION_SETTINGS)}")
        if not 0 < self.min_cosine <= 1:
            problems.append("min_cosine must be in (0, 1]")
        if self.generation_batch_size is not None and self.generation_batch_size < 1:
            problems.append("generation_batch_size must be >= 1")
        if self.max_leases is not None and self.max_leases < 1:
            problems.append("max_leases must be >= 1")
        if self.ollama_parallel < 1:
            problems.append("ollama_parallel must be >= 1")
        if self.policy.idle_minutes < 0:
            problems.append("policy.idle_minutes must be >= 0 (0 turns the check off)")
        if problems:
            raise AgentConfigError("; ".join(problems))
        return self


def parse_preference(text: str) -> Preference:
    """`search`, `search/ranker` or `search/ranker/emb-1`."""
    parts = text.strip().split("/")
    if not 1 <= len(parts) <= 3 or not all(is_name(p) for p in parts):
        raise AgentConfigError(f"--prefer {text!r}: expected team[/project[/task_name]], each 1-64 of [A-Za-z0-9._-]")
    padded = [*parts, None, None]
    return Preference(team=parts[0], project=padded[1], task_name=padded[2])


def load_toml(path: Path) -> dict[str, Any]:
    try:
        with path.expanduser().open("rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise AgentConfigError(f"cannot read config file {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise AgentConfigError(f"config file {path} is not valid TOML: {exc}") from exc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The agent's flags. Defaults are SUPPRESS so that an absent flag leaves the attribute unset
    and the file or environment decides (and so that a subcommand's parser cannot overwrite a
    value given to its parent)."""
    s = argparse.SUPPRESS
    add = parser.add_argument
    add("--config", default=s, metavar="PATH",
        help=f"TOML config file (default: $XDG_CONFIG_HOME/minions/agent.toml, else {DEFAULT_CONFIG_PATH})")
    add("--api-url", default=s, help="API URL (env MINIONS_API_URL)")
    add("--token", default=s, help="executor token (env MINIONS_TOKEN)")
    add("--name", default=s, help="executor name (default: host name)")
    add(
        "--kind",
        dest="kinds",
        action="append",
        choices=KINDS,
        default=s,
        help="kind to serve; repeatable (default: all)",
    )
    add(
        "--model",
        dest="models",
        action="append",
        default=s,
        help="model to advertise, besides those found locally; repeatable",
    )
    add(
        "--prefer",
        dest="prefer",
        action="append",
        default=s,
        metavar="TEAM[/PROJECT[/TASK]]",
        help="work to take first; repeatable",
    )
    add(
        "--idle-minutes",
        type=float,
        default=s,
        help="work only after the user is idle this long (macOS; default 5, 0 = off)",
    )
    add(
        "--no-idle-check",
        dest="idle_minutes",
        action="store_const",
        const=0.0,
        default=s,
        help="do not wait for the user to be idle",
    )
    add("--no-ac-check", dest="require_ac_power", action="store_false", default=s, help="also work on battery")
    add(
        "--no-thermal-check",
        dest="avoid_thermal_pressure",
        action="store_false",
        default=s,
        help="also work when the CPU is thermally throttled",
    )
    add("--max-leases", type=int, default=s, metavar="N",
        help="leases held at once (default: as deep as the subtasks' measured duration calls for; 1: no "
        "pipeline, one subtask at a time)")
    add("--max-load", type=float, default=s, help="Linux: take no work above this 1-minute load average")
    add("--ollama-host", default=s, help=f"Ollama server (env OLLAMA_HOST, default {DEFAULT_OLLAMA_HOST})")
    add("--allow-pull", action="store_true", default=s, help="let Ollama pull a missing model")
    add(
        "--mps-memory-fraction",
        type=float,
        default=s,
        help="the most of unified memory torch may take on MPS (default 0.5)",
    )
    add("--completion-backend", choices=COMPLETION_BACKENDS, default=s, help="default ollama")
    add("--threads", type=int, default=s, help="torch CPU threads (default: torch's choice)")
    add("--device", choices=("mps", "cuda", "cpu"), default=s, help="force a device")
    add(
        "--precision",
        choices=PRECISION_SETTINGS,
        default=s,
        help="embedding precision (default auto: the fastest this device runs natively whose vectors "
        "stay within --min-cosine of fp32)",
    )
    add("--min-cosine", type=float, default=s, help="accuracy gate of --precision auto (default 0.9999)")
    add(
        "--backend",
        choices=BACKENDS,
        default=s,
        help="inference engine (default auto: on Apple silicon with the [mlx] extra, torch or MLX per model, "
        "whichever is faster within --min-cosine of fp32 transformers; torch elsewhere; ollama: completions "
        "through Ollama)",
    )
    add(
        "--generation-batch-size",
        type=int,
        default=s,
        help="records generated together by the transformers completion backend (default: per device)",
    )
    add(
        "--ollama-parallel",
        type=int,
        default=s,
        help="Ollama requests in flight per subtask (default: env OLLAMA_NUM_PARALLEL, else 1)",
    )


def from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> AgentConfig:
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    values.update(_file_values(getattr(args, "config", None)))
    values.update(_env_values(env))
    values.update(_flag_values(args))
    return build(values)


def build(values: Mapping[str, Any]) -> AgentConfig:
    """An AgentConfig from flat values (file, env and flag names alike), validated."""
    plain = {f.name for f in dataclasses.fields(AgentConfig)} - {"policy", "preferences"}
    policy_names = {f.name for f in dataclasses.fields(PolicyConfig)}
    unknown = set(values) - plain - policy_names - {"prefer"}
    if unknown:
        raise AgentConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
    kwargs: dict[str, Any] = {k: v for k, v in values.items() if k in plain}
    for key in ("kinds", "models"):
        if key in kwargs:
            kwargs[key] = tuple(dict.fromkeys(_strings(kwargs[key], key)))
    kwargs["preferences"] = tuple(parse_preference(p) for p in _strings(values.get("prefer", []), "prefer"))
    kwargs["policy"] = PolicyConfig(**{k: v for k, v in values.items() if k in policy_names})
    try:
        return AgentConfig(**kwargs).validate()
    except TypeError as exc:
        raise AgentConfigError(str(exc)) from exc


def _strings(value: Any, key: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        raise AgentConfigError(f"{key} must be a list of strings")
    return list(value)


def _file_values(path: str | None) -> dict[str, Any]:
    if path is None:
        default = default_config_path()
        if not default.exists():
            return {}
        file = default
    else:
        file = Path(path)
    data = load_toml(file)
    policy = data.pop("policy", {})
    if not isinstance(policy, dict):
        raise AgentConfigError(f"{file}: [policy] must be a table")
    return {**data, **policy}


def _env_values(env: Mapping[str, str]) -> dict[str, Any]:
    # The client settings only (API URL, token): the server's are none of the agent's business.
    client = minions_config.client_from_env(env)
    values: dict[str, Any] = {}
    if client.api_url:
        values["api_url"] = client.api_url
    if client.token:
        values["token"] = client.token
    if env.get("OLLAMA_HOST"):
        values["ollama_host"] = env["OLLAMA_HOST"]
    if env.get("OLLAMA_NUM_PARALLEL"):
        try:
            values["ollama_parallel"] = int(env["OLLAMA_NUM_PARALLEL"])
        except ValueError:
            raise AgentConfigError("OLLAMA_NUM_PARALLEL must be an integer") from None
    return values


def _flag_values(args: argparse.Namespace) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(AgentConfig)} | {f.name for f in dataclasses.fields(PolicyConfig)}
    return {k: v for k, v in vars(args).items() if k in names | {"prefer"}}


def to_toml(config: AgentConfig) -> str:
    """The config as a TOML file that `load_toml` + `build` read back to the same value."""
    lines = [
        f"api_url = {_toml(config.api_url)}",
        f"token = {_toml(config.token)}",
        f"name = {_toml(config.name)}",
        f"kinds = {_toml(list(config.kinds))}",
        f"models = {_toml(list(config.models))}",
        f"prefer = {_toml([str(p) for p in config.preferences])}",
        f"ollama_host = {_toml(config.ollama_host)}",
        f"allow_pull = {_toml(config.allow_pull)}",
        f"mps_memory_fraction = {_toml(config.mps_memory_fraction)}",
        f"completion_backend = {_toml(config.completion_backend)}",
    ]
    if config.threads is not None:
        lines.append(f"threads = {config.threads}")
    if config.device is not None:
        lines.append(f"device = {_toml(config.device)}")
    lines += [
        f"precision = {_toml(config.precision)}",
        f"backend = {_toml(config.backend)}",
        f"min_cosine = {_toml(config.min_cosine)}",
        f"ollama_parallel = {config.ollama_parallel}",
    ]
    if config.generation_batch_size is not None:
        lines.append(f"generation_batch_size = {config.generation_batch_size}")
    policy = config.policy
    lines += [
        "",
        "[policy]",
        f"idle_minutes = {_toml(policy.idle_minutes)}",
        f"require_ac_power = {_toml(policy.require_ac_power)}",
        f"avoid_thermal_pressure = {_toml(policy.avoid_thermal_pressure)}",
    ]
    if policy.max_load is not None:
        lines.append(f"max_load = {_toml(policy.max_load)}")
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(float(value)) if isinstance(value, float) else str(value)
    if isinstance(value, str):
        # A TOML basic string has JSON's escapes for the characters that matter here.
        return jsoncodec.dumps_str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")
