"""The one configuration loader: environment variables (API.md's table), each also a CLI flag.

Two kinds of settings, each with one home:
- `Settings`: the server side (database, store, ports, timing, limits). Each field's metadata says
  which processes take it (`used_by`); `names_for(process)` is that process's flags, so the list
  lives here once. The lease timeout and the max attempts are cluster-wide: their home is the
  database (minions/cluster_settings.py); here they are only what `minions up` / `minions db migrate`
  write there when given (MINIONS_LEASE_TIMEOUT_S, MINIONS_MAX_ATTEMPTS), None otherwise.
- `ClientSettings`: what a client reads (API URL, token): the CLI, the SDK and the agent.

Every process builds its settings from the environment, then lets its command-line flags override
fields (`add_arguments` + `from_args`), so `MINIONS_SWEEP_INTERVAL_S=2` and `--sweep-interval-s 2`
mean the same thing everywhere; `to_env()` goes the other way, for a parent starting services.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from minions.names import NAME


class ConfigError(ValueError):
    """A setting has a value that cannot work; the message names the variable."""


API, SPLITTER, WATCHDOG, UP, MIGRATE = "api", "splitter", "watchdog", "up", "migrate"
_SERVICES = frozenset({API, SPLITTER, WATCHDOG})


def _setting(default: Any, env: str, help: str, used_by: Iterable[str]) -> Any:
    return field(default=default, metadata={"env": env, "help": help, "used_by": frozenset(used_by)})


@dataclass(frozen=True)
class Settings:
    """The server side's settings; `used_by` says which processes read each (`up` starts them all)."""

    database_url: str = _setting("", "MINIONS_DATABASE_URL", "PostgreSQL URL of the services",
                                 {*_SERVICES, UP, MIGRATE})
    # `minions up` without a database URL runs an embedded PostgreSQL on 127.0.0.1 (minions/embedded_pg.py).
    db_port: int = _setting(0, "MINIONS_DB_PORT", "port of the embedded PostgreSQL of `minions up` on 127.0.0.1 "
                            "(0: the one it had last, else a free one)", {UP})
    store: str = _setting("", "MINIONS_STORE", "object store: s3://bucket/prefix or file:///path", {*_SERVICES, UP})
    s3_endpoint_url: str = _setting("", "MINIONS_S3_ENDPOINT_URL", "endpoint of an S3-compatible store", _SERVICES)
    admin_token: str = _setting("", "MINIONS_ADMIN_TOKEN", "admin token that `minions up` installs", {UP})
    heartbeat_interval_s: float = _setting(30.0, "MINIONS_HEARTBEAT_INTERVAL_S", "executor heartbeat period "
                                           "(a lease timeout must exceed it)", {API, UP, MIGRATE})
    # Cluster-wide (minion_settings): written by `up` / `db migrate` when given, never read by a service.
    lease_timeout_s: float | None = _setting(None, "MINIONS_LEASE_TIMEOUT_S",
                                             "silence before the watchdog reclaims: written to the database",
                                             {UP, MIGRATE})
    max_attempts: int | None = _setting(None, "MINIONS_MAX_ATTEMPTS",
                                        "attempts before a subtask fails for good: written to the database",
                                        {UP, MIGRATE})
    long_poll_s: float = _setting(30.0, "MINIONS_LONG_POLL_S", "longest a claim waits", {API, UP})
    host: str = _setting("127.0.0.1", "MINIONS_HOST", "API bind address", {API, UP})
    port: int = _setting(8080, "MINIONS_PORT", "API port", {API, UP})
    public_url: str = _setting("", "MINIONS_PUBLIC_URL", "API URL as executors reach it (signed store URLs)", {API})
    straggler_factor: float = _setting(4.0, "MINIONS_STRAGGLER_FACTOR",
                                       "back up a lease running this many times the median (0: never)", {API, UP})
    # sql/schema/11_checks.sql: set on the API's database sessions, read by the claim.
    spot_check_share: float = _setting(0.02, "MINIONS_SPOT_CHECK_SHARE",
                                       "share of a trusted executor's subtasks run again by another executor "
                                       "before they commit (0 to 1)", {API, WATCHDOG, UP})
    spot_check_team_shares: str = _setting("", "MINIONS_SPOT_CHECK_TEAM_SHARES",
                                           "teams with a share of their own: team=share,team=share "
                                           "(sql/schema/11_checks.sql)", {API, WATCHDOG, UP})
    spot_check_min_cosine: float = _setting(0.999, "MINIONS_SPOT_CHECK_MIN_COSINE",
                                            "two embeddings of a record agree at this cosine or more", {API, UP})
    spot_check_min_similarity: float = _setting(0.9, "MINIONS_SPOT_CHECK_MIN_SIMILARITY",
                                                "two greedy completions of a record agree at this text similarity "
                                                "or more (0 to 1; 1: identical text)", {API, UP})
    spot_check_wait_s: float = _setting(600.0, "MINIONS_SPOT_CHECK_WAIT_S",
                                        "a held result no replica has judged within this many seconds is "
                                        "marked overdue on its task (a volunteer's stays held; a dispute runs "
                                        "again)", {WATCHDOG, UP})
    trust_agreements: int = _setting(5, "MINIONS_TRUST_AGREEMENTS",
                                     "checks a new executor (or one whose model changed) must pass before only "
                                     "the random share of its results is checked (0: trust at once)",
                                     {API, WATCHDOG, UP})
    quarantine_after: int = _setting(2, "MINIONS_QUARANTINE_AFTER",
                                     "lost quorums (or leases let pass their age cap) after which an executor is "
                                     "quarantined", {API, WATCHDOG, UP})
    pin_release_s: float = _setting(600.0, "MINIONS_PIN_RELEASE_S",
                                    "a task's model pin no online executor has reported for this many seconds is "
                                    "released (its volunteers' results run again)", {WATCHDOG, UP})
    # sql/schema/06_leases.sql's minion_lease_age_cap: the watchdog ends a lease older than this, heartbeats or not.
    lease_age_factor: float = _setting(20.0, "MINIONS_LEASE_AGE_FACTOR",
                                       "a lease (or replica) may run this many times a typical run of its size "
                                       "(the task's median, else its kind's) before it is ended", {WATCHDOG, UP})
    lease_age_floor_s: float = _setting(120.0, "MINIONS_LEASE_AGE_FLOOR_S",
                                        "a lease is never ended for its age before this many seconds",
                                        {WATCHDOG, UP})
    lease_age_ceilings: str = _setting("embedding=1800,completion=3600,*=3600", "MINIONS_LEASE_AGE_CEILINGS",
                                       "the most seconds a lease of each kind may run (kind=seconds,...; '*' for "
                                       "the others), also its cap before anything is measured", {WATCHDOG, UP})
    sweep_interval_s: float = _setting(10.0, "MINIONS_SWEEP_INTERVAL_S", "watchdog/splitter safety-net sweep period",
                                       {SPLITTER, WATCHDOG, UP})
    listen_probe_s: float = _setting(30.0, "MINIONS_LISTEN_PROBE_S", "liveness probe period of each LISTEN connection",
                                     _SERVICES)
    max_input_bytes: int = _setting(2 * 1024**3, "MINIONS_MAX_INPUT_BYTES", "largest POST /api/v1/inputs body", {API})
    max_output_bytes: int = _setting(256 * 1024**2, "MINIONS_MAX_OUTPUT_BYTES",
                                     "largest output PUT to a local-store URL", {API})
    team_input_quota_bytes: int = _setting(20 * 1024**3, "MINIONS_TEAM_INPUT_QUOTA_BYTES",
                                           "input bytes a team may store (0: no quota)", {API})
    # OpenAI's API under /v1 (services/api/openai/bounds.py): a request is checked before it is decoded.
    openai_max_request_bytes: int = _setting(4 * 1024**2, "MINIONS_OPENAI_MAX_REQUEST_BYTES",
                                             "largest /v1 embeddings or (chat) completions body, and largest "
                                             "line of a /v1 batch input file", {API})
    gc_grace_s: float = _setting(3600.0, "MINIONS_GC_GRACE_S", "age before unreferenced objects are garbage",
                                 {WATCHDOG})
    gc_interval_s: float = _setting(600.0, "MINIONS_GC_INTERVAL_S", "watchdog's garbage-collection period (0: off)",
                                    {WATCHDOG})
    inline_split_max_bytes: int = _setting(1024**2, "MINIONS_INLINE_SPLIT_MAX_BYTES",
                                           "inline records up to this size are split at submission, "
                                           "no splitter hop (0: never)", {API})
    # The retention job (minions/retention.py): finished tasks older than this are deleted with their rows.
    retention_days: float = _setting(30.0, "MINIONS_RETENTION_DAYS",
                                     "age of finished tasks the retention job deletes (0: off)", {WATCHDOG})
    retention_interval_s: float = _setting(3600.0, "MINIONS_RETENTION_INTERVAL_S", "watchdog's retention-job period",
                                           {WATCHDOG})
    compact_interval_s: float = _setting(5.0, "MINIONS_COMPACT_INTERVAL_S",
                                         "watchdog's period for compacting completed tasks' results into parts "
                                         "(0: off)",
                                         {WATCHDOG})
    result_part_bytes: int = _setting(64 * 1024**2, "MINIONS_RESULT_PART_BYTES",
                                      "size a compacted result part grows to", {WATCHDOG})
    # Fair share between teams (sql/schema/15_fair_share.sql): the watchdog's negotiation.
    fair_share_interval_s: float = _setting(1.0, "MINIONS_FAIR_SHARE_INTERVAL_S",
                                            "how often the watchdog recomputes whose turn it is between teams "
                                            "(0: off, plain priority-then-FIFO)", {WATCHDOG})
    fair_share_half_life_s: float = _setting(3600.0, "MINIONS_FAIR_SHARE_HALF_LIFE_S",
                                             "half-life of a team's recent usage (compute-seconds)", {WATCHDOG})
    fair_share_round: int = _setting(60, "MINIONS_FAIR_SHARE_ROUND",
                                     "turns in a round of the teams sharing a queue (shares are multiples of "
                                     "1/round)", {WATCHDOG})
    starvation_s: float = _setting(300.0, "MINIONS_STARVATION_S",
                                   "a task with work pending and no lease this long while executors that "
                                   "could serve it are busy elsewhere is warned as starving", {WATCHDOG})

    # Slow clients (services/api/http/slow_clients.py): a slowloris cannot pin the API's sockets.
    header_timeout_s: float = _setting(10.0, "MINIONS_HEADER_TIMEOUT_S",
                                       "a new connection's request headers must arrive within this", {API})
    body_timeout_s: float = _setting(30.0, "MINIONS_BODY_TIMEOUT_S",
                                     "grace before a request body must arrive at MINIONS_BODY_MIN_RATE (else 408)",
                                     {API})
    body_min_rate: float = _setting(1024.0, "MINIONS_BODY_MIN_RATE", "slowest request body accepted, bytes/s", {API})
    max_connections_per_ip: int = _setting(256, "MINIONS_MAX_CONNECTIONS_PER_IP",
                                           "open connections one address may hold, across the API's "
                                           "workers (more: 429)", {API})
    # Registration (sql/schema/05_executors.sql): what one executor token may add to `executors`.
    max_executors_per_token: int = _setting(1000, "MINIONS_MAX_EXECUTORS_PER_TOKEN",
                                            "executor names one token may register (more: 403)", {API})
    registrations_per_minute: int = _setting(60, "MINIONS_REGISTRATIONS_PER_MINUTE",
                                             "new executor names one token may register a minute (more: 429)",
                                             {API})
    # The batched executor protocol (docs/API.md, "Executor protocol").
    max_claim: int = _setting(32, "MINIONS_MAX_CLAIM", "most subtasks one claim may ask for (max)", {API})
    inline_input_bytes: int = _setting(64 * 1024, "MINIONS_INLINE_INPUT_BYTES",
                                       "inputs up to this ride inline in a claim's answer (0: never)", {API})
    # A lease's input URL works for the lease timeout plus this, renewed by each heartbeat
    # that finds the lease live (the local store also refuses it once the lease ends; S3 cannot).
    input_url_margin_s: float = _setting(60.0, "MINIONS_INPUT_URL_MARGIN_S",
                                         "an input URL outlives its lease's expiry by this (clock skew, a GET "
                                         "begun at the end)", {API})
    inline_output_bytes: int = _setting(1024 * 1024, "MINIONS_INLINE_OUTPUT_BYTES",
                                        "largest output a complete may carry inline (0: never)", {API})
    # sql/schema/07_results.sql: a small result is committed in its subtask's row, no object per
    # subtask (a file, an fsync and a rename, or an S3 PUT); the parts of compaction take it from there.
    result_in_database_bytes: int = _setting(4 * 1024, "MINIONS_RESULT_IN_DATABASE_BYTES",
                                             "inline outputs up to this are kept in the database, not as an "
                                             "object each (0: never)", {API})
    # sql/schema/08_inputs.sql: the inline records of a task split at submission are committed
    # with it, no input object (an input_objects row, a file, an fsync and a rename, or an S3 PUT);
    # its claims send their ranges from there, whatever MINIONS_INLINE_INPUT_BYTES says.
    input_in_database_bytes: int = _setting(64 * 1024, "MINIONS_INPUT_IN_DATABASE_BYTES",
                                            "inline records up to this are kept in the database, not as an "
                                            "input object (0: never)", {API})

    def validate(self) -> Settings:
        problems = []
        for name in ("heartbeat_interval_s", "long_poll_s", "sweep_interval_s", "listen_probe_s",
                     "header_timeout_s", "body_timeout_s", "body_min_rate", "max_connections_per_ip",
                     "max_executors_per_token", "registrations_per_minute"):
            if getattr(self, name) <= 0:
                problems.append(f"{_env(name)} must be > 0")
        if self.straggler_factor < 0:
            problems.append("MINIONS_STRAGGLER_FACTOR must be >= 0 (0 turns backups off)")
        if not 0 <= self.spot_check_share <= 1:
            problems.append("MINIONS_SPOT_CHECK_SHARE must be from 0 to 1")
        problems.extend(team_share_problems(self.spot_check_team_shares))
        if not -1 <= self.spot_check_min_cosine <= 1:
            problems.append("MINIONS_SPOT_CHECK_MIN_COSINE must be from -1 to 1")
        if not 0 <= self.spot_check_min_similarity <= 1:
            problems.append("MINIONS_SPOT_CHECK_MIN_SIMILARITY must be from 0 to 1")
        if self.spot_check_wait_s <= 0:
            problems.append("MINIONS_SPOT_CHECK_WAIT_S must be > 0")
        if self.pin_release_s <= 0:
            problems.append("MINIONS_PIN_RELEASE_S must be > 0")
        if self.lease_age_factor < 1 or self.lease_age_floor_s <= 0:
            problems.append("MINIONS_LEASE_AGE_FACTOR must be >= 1 and MINIONS_LEASE_AGE_FLOOR_S > 0")
        problems.extend(ceiling_problems(self.lease_age_ceilings))
        if self.fair_share_interval_s < 0:
            problems.append("MINIONS_FAIR_SHARE_INTERVAL_S must be >= 0 (0 turns fair share off)")
        if self.fair_share_half_life_s <= 0 or self.starvation_s <= 0:
            problems.append("MINIONS_FAIR_SHARE_HALF_LIFE_S and MINIONS_STARVATION_S must be > 0")
        if not 1 <= self.fair_share_round <= 10000:
            problems.append("MINIONS_FAIR_SHARE_ROUND must be from 1 to 10000")
        if self.trust_agreements < 0:
            problems.append("MINIONS_TRUST_AGREEMENTS must be >= 0")
        if self.quarantine_after < 1:
            problems.append("MINIONS_QUARANTINE_AFTER must be >= 1")
        for name in ("max_input_bytes", "max_output_bytes", "result_part_bytes", "openai_max_request_bytes"):
            if getattr(self, name) <= 0:
                problems.append(f"{_env(name)} must be > 0")
        if self.result_in_database_bytes > 1024 * 1024:
            # Rows are not the place for big results (and the check reads such outputs whole).
            problems.append("MINIONS_RESULT_IN_DATABASE_BYTES must be <= 1048576 (1 MiB)")
        if self.input_in_database_bytes > 1024 * 1024:
            # Nor for big inputs: every claim of the task carries its ranges inline (task_inputs' bound).
            problems.append("MINIONS_INPUT_IN_DATABASE_BYTES must be <= 1048576 (1 MiB)")
        if self.max_claim < 1:
            problems.append("MINIONS_MAX_CLAIM must be >= 1")
        if not 0 <= self.db_port <= 65535:
            problems.append("MINIONS_DB_PORT must be a TCP port, 1-65535 (0: chosen for you)")
        if not 0 <= self.input_url_margin_s <= 86400:
            problems.append("MINIONS_INPUT_URL_MARGIN_S must be 0 to 86400 (a day)")
        for name in ("team_input_quota_bytes", "gc_grace_s", "gc_interval_s", "inline_input_bytes",
                     "inline_output_bytes", "retention_days", "compact_interval_s", "result_in_database_bytes",
                     "input_in_database_bytes"):
            if getattr(self, name) < 0:
                problems.append(f"{_env(name)} must be >= 0")
        if self.retention_interval_s <= 0:
            problems.append("MINIONS_RETENTION_INTERVAL_S must be > 0")
        if self.max_attempts is not None and self.max_attempts < 1:
            problems.append("MINIONS_MAX_ATTEMPTS must be >= 1")
        if self.lease_timeout_s is not None:
            try:
                check_lease_timeout(self.lease_timeout_s, self.heartbeat_interval_s)
            except ConfigError as exc:
                problems.append(str(exc))
        if problems:
            raise ConfigError("; ".join(problems))
        return self

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    def to_env(self, names: Iterable[str] | None = None) -> dict[str, str]:
        """The environment that gives a child process these settings (all, or the `names`), as
        `from_env` reads it back; unset values (empty, None) are left out."""
        wanted = None if names is None else set(names)
        return {f.metadata["env"]: str(getattr(self, f.name)) for f in dataclasses.fields(self)
                if (wanted is None or f.name in wanted) and getattr(self, f.name) not in ("", None)}

    @property
    def url_for_executors(self) -> str:
        """Base URL that signed local-store URLs point at."""
        return (self.public_url or f"http://{_url_host(self.host)}:{self.port}").rstrip("/")


def names_for(*processes: str) -> tuple[str, ...]:
    """The settings the given processes read (their flags; what `minions up` hands them)."""
    return tuple(f.name for f in dataclasses.fields(Settings) if f.metadata["used_by"] & set(processes))


def team_share_problems(value: str) -> list[str]:
    """What is wrong with a MINIONS_SPOT_CHECK_TEAM_SHARES value ('team=share,...'; empty: none)."""
    problems = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        team, _, share = item.partition("=")
        try:
            ok = bool(NAME.match(team.strip())) and 0 <= float(share) <= 1
        except ValueError:
            ok = False
        if not ok:
            problems.append(f"MINIONS_SPOT_CHECK_TEAM_SHARES: {item!r} is not team=share (a team name, a share "
                            "from 0 to 1)")
    return problems


def ceiling_problems(value: str) -> list[str]:
    """What is wrong with a MINIONS_LEASE_AGE_CEILINGS value ('kind=seconds,...', '*' for the others)."""
    problems = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        kind, _, seconds = item.partition("=")
        try:
            ok = (kind.strip() == "*" or bool(NAME.match(kind.strip()))) and float(seconds) > 0
        except ValueError:
            ok = False
        if not ok:
            problems.append(f"MINIONS_LEASE_AGE_CEILINGS: {item!r} is not kind=seconds (a kind or '*', seconds > 0)")
    return problems


def check_lease_timeout(lease_timeout_s: float, heartbeat_interval_s: float) -> None:
    """An executor must get a heartbeat through before its leases count as lost."""
    if lease_timeout_s <= 0:
        raise ConfigError("MINIONS_LEASE_TIMEOUT_S must be > 0")
    if lease_timeout_s <= heartbeat_interval_s:
        raise ConfigError(f"the lease timeout ({lease_timeout_s:g} s) must exceed the heartbeat interval "
                          f"(MINIONS_HEARTBEAT_INTERVAL_S, {heartbeat_interval_s:g} s)")


@dataclass(frozen=True)
class ClientSettings:
    """What a client (the CLI, the SDK, the agent) reads from its environment; empty: not given
    (minions/sdk/client.py `client_settings` then looks in a local `minions up`'s up.json)."""

    api_url: str = field(default="", metadata={"env": "MINIONS_API_URL", "help": "where clients connect"})
    token: str = field(default="", metadata={"env": "MINIONS_TOKEN", "help": "bearer token of clients"})


def client_from_env(environ: Mapping[str, str] | None = None) -> ClientSettings:
    env = os.environ if environ is None else environ
    return ClientSettings(**{f.name: env.get(f.metadata["env"], "") for f in dataclasses.fields(ClientSettings)})


def _url_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "") else host


def _env(field_name: str) -> str:
    for f in dataclasses.fields(Settings):
        if f.name == field_name:
            return str(f.metadata["env"])
    raise KeyError(field_name)


def _convert(f: dataclasses.Field[Any], raw: str) -> Any:
    kind = f.type if isinstance(f.type, type) else {"float": float, "int": int, "str": str}[
        str(f.type).removesuffix(" | None")]
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
        # The flag's own default is None ("not given": the environment decides); the help says
        # what the setting is when neither is given.
        default = "" if f.default in (None, "") else f", default: {f.default}"
        parser.add_argument(
            "--" + name.replace("_", "-"), dest=f"setting_{name}", default=None, metavar=name.upper(),
            help=f"{f.metadata['help']} (env {f.metadata['env']}{default})",
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
