"""`minions up`: everything on one machine with no setup. An embedded PostgreSQL (unless
MINIONS_DATABASE_URL points elsewhere), a local folder as object store, the API, splitter and
watchdog, and N local agents. State lives in --data-dir, so a restart keeps queue and results."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from minions import cluster_settings, config, jsoncodec, up_json
from minions.cli.admin import create_token
from minions.cli.instance import DataDirLock, InstanceError, bind_listener
from minions.cli.supervisor import Supervisor
from minions.db.migrate import migrate
from minions.embedded_pg import EmbeddedPostgres
from minions.logging import configure
from minions.private_files import DIR_MODE, make_private_dir, tighten
from minions.redaction import redact
from minions.sdk import MinionsClient
from minions.sdk.health import wait_until_healthy
from minions.tokens import new_token

SETTINGS = config.names_for(config.UP)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("up", help="run everything locally: database, store, services, agents",
                       description="Run Minions on this machine with no setup: an embedded PostgreSQL (unless "
                                   "--database-url points at one), a local folder as object store, the API, "
                                   "splitter and watchdog, and --executors local agents. It says `ready` once the "
                                   "API answers and every local agent has registered; state lives in --data-dir, "
                                   "so a restart keeps the queue and the results. Ctrl-C stops everything.")
    config.add_arguments(p, SETTINGS)
    p.add_argument("--data-dir", type=Path, default=Path(".minions"),
                   help="state folder: database, store, logs, up.json (default ./.minions)")
    p.add_argument("--executors", type=int, default=0, help="local agents to start (default 0)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="API processes serving the one port (default: env MINIONS_API_WORKERS, else one per core)")
    p.add_argument("--executor-arg", action="append", default=[],
                   help="extra argument for each local agent (repeatable), e.g. --executor-arg=--kind=sleep")
    p.add_argument("--sample", action="store_true",
                   help="submit a sample embedding task, wait for it, print results, then stop")
    p.add_argument("--sample-records", type=int, default=300, help="sentences in the --sample task")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    # Everything `up` and its children create (store objects, logs, results of --sample) is for this
    # user alone: they hold every team's data. Explicit modes where we create files say it again.
    os.umask(0o077)
    configure("up", for_terminal=True)
    settings = config.from_args(args)
    if args.workers is not None and args.workers < 1:
        raise SystemExit("minions up: --workers must be 1 or more")
    if args.sample and args.executors < 1:
        raise SystemExit("minions up: --sample needs at least one local executor (--executors 1)")
    if settings.db_port and settings.database_url:
        raise SystemExit("minions up: --db-port (MINIONS_DB_PORT) is the embedded PostgreSQL's port; "
                         "MINIONS_DATABASE_URL points at another database")
    data_dir: Path = args.data_dir.resolve()
    make_private_dir(data_dir)  # a new one is 0700 from the start
    # Before anything starts: a second `minions up` on this data dir (or on a taken port) must not
    # touch the first one's database, services, up.json or folder modes.
    lock = DataDirLock(data_dir)
    try:
        lock.acquire(f"http://{_host(settings.host)}:{settings.port}")
        listener = bind_listener(settings.host, settings.port)
    except InstanceError as exc:
        lock.release()
        print(f"minions up: {exc}", file=sys.stderr)
        return 1
    tighten(data_dir, DIR_MODE)  # one an older version left open (PostgreSQL's start re-allows traversal)
    try:
        return asyncio.run(_up(args, settings, data_dir, listener.fileno()))
    except asyncio.CancelledError:  # stopped by SIGINT/SIGTERM, everything stopped in order
        return 130 if args.sample else 0
    finally:
        listener.close()
        lock.release()


async def _up(args: argparse.Namespace, settings: config.Settings, data_dir: Path, listen_fd: int) -> int:
    _stop_on_signal()
    pg: EmbeddedPostgres | None = None
    database_url = settings.database_url
    supervisor = Supervisor(data_dir / "logs")
    try:
        if not database_url:
            print(f"starting PostgreSQL in {data_dir / 'pg'} ...", flush=True)
            pg = EmbeddedPostgres(data_dir / "pg", port=settings.db_port)
            try:
                await asyncio.to_thread(pg.start)
            except RuntimeError as exc:  # its port taken, most often: PostgreSQL's log says
                raise SystemExit(f"minions up: PostgreSQL did not start on 127.0.0.1:{pg.port} (choose the port "
                                 f"with --db-port or MINIONS_DB_PORT): {exc}") from None
            database_url = pg.url
        applied = await migrate(database_url)
        if applied:
            print(f"schema: applied {', '.join(applied)}")
        for key, value in (await cluster_settings.apply_given_at(database_url, settings)).items():
            print(f"cluster setting: {key} = {value}")
        previous = _read_json(data_dir / "up.json")
        admin_token = settings.admin_token or previous.get("admin_token") or new_token()
        await create_token(database_url, "admin", None, "minions up", admin_token)
        store = settings.store or (data_dir / "store").as_uri()
        api_url = f"http://{_host(settings.host)}:{settings.port}"
        env = _service_env(settings, database_url, store, api_url)

        # The API serves the socket bound above (restarts included): see instance.bind_listener.
        # One API worker per core (services/api/prefork.py), unless --workers / MINIONS_API_WORKERS say otherwise.
        workers = str(args.workers or os.environ.get("MINIONS_API_WORKERS") or os.cpu_count() or 1)
        await supervisor.start("api", "minions.services.api", ["--workers", workers],
                               {**env, "MINIONS_LISTEN_FD": str(listen_fd)}, pass_fds=(listen_fd,))
        await supervisor.start("splitter", "minions.services.splitter", [], env)
        await supervisor.start("watchdog", "minions.services.watchdog", [], env)
        await _wait_healthy(api_url, supervisor)

        # No local agent, no executor token: nothing would use it.
        executor_token = await _executor_token(data_dir, database_url) if args.executors > 0 else ""
        agent_names = [f"local-{i + 1}" for i in range(args.executors)]
        before = await _registrations(api_url, admin_token, agent_names)
        for i in range(args.executors):
            # The machine's owner started these by hand: the idle/power/thermal policy is off.
            agent_args = ["--name", f"local-{i + 1}", "--no-idle-check", "--no-ac-check", "--no-thermal-check"]
            await supervisor.start(f"agent-{i + 1}", "minions.agents.macos", [*agent_args, *args.executor_arg],
                                   {**env, "MINIONS_TOKEN": executor_token})

        info = {"api_url": api_url, "database_url": database_url, "store": store, "admin_token": admin_token}
        _write_json(data_dir / "up.json", info)
        # Also where clients look from any folder (XDG state dir): the latest `minions up` wins.
        up_json.publish_up_json(data_dir, info)
        print(f"Minions is up.\n  API:       {api_url}\n  database:  {redact(database_url)}\n  store:     {store}\n"
              f"  admin token: {admin_token}\n  executors: {args.executors} local\n"
              f"  logs:      {data_dir / 'logs'}\n  (written to {data_dir / 'up.json'}; Ctrl-C stops)",
              flush=True)
        # Ready means a task submitted now finds its executors: each local agent has registered (after
        # loading its models, which it does first), so nothing says "no online executor" meanwhile.
        try:
            agents = await _wait_registered(api_url, admin_token, before, supervisor)
        except AgentCrashLoop as exc:
            print(f"minions up: {exc}", file=sys.stderr, flush=True)
            return 1
        for agent in agents:
            print(f"  {describe_agent(agent)}")
        print("ready", flush=True)
        if args.sample:
            from minions.cli.sample_run import run_sample

            return await run_sample(api_url, admin_token, data_dir, args.sample_records)
        await _until_signal()
        return 0
    finally:
        print("stopping ...", flush=True)
        up_json.withdraw_up_json(data_dir)
        # Agents first, together (each hands back its lease), then the services one by one.
        await supervisor.stop_children([n for n in supervisor.children if n.startswith("agent-")])
        await supervisor.stop()
        if pg is not None:
            await asyncio.to_thread(pg.stop)


REGISTER_POLL_S = 0.5
STILL_WAITING_S = 30.0  # how often a slow registration is said again
# A local agent that died this often before it registered will not (a bad --executor-arg, a model
# it cannot load): up says why and stops rather than wait forever while the supervisor restarts it.
GIVE_UP_AFTER_EXITS = 3
LOG_LINES_SHOWN = 5


class AgentCrashLoop(Exception):
    """A local agent keeps exiting before it registers; the message quotes its log."""
ONLINE = ("idle", "busy")  # an executor's status in GET /api/v1/executors once it registered and beats


async def _registrations(api_url: str, token: str, names: list[str]) -> dict[str, str | None]:
    """Each name's `registered_at` as the API has it now (None: never registered): a local agent has
    registered in this run once its row says otherwise, and it is online."""
    if not names:
        return {}
    async with MinionsClient(api_url, token) as client:
        rows = {e["name"]: e for e in await client.executors()}
    return {name: rows[name]["registered_at"] if name in rows else None for name in names}


async def _wait_registered(api_url: str, token: str, before: dict[str, str | None],
                           supervisor: Supervisor) -> list[dict[str, Any]]:
    """The executors' rows of the local agents once every one has registered in this run."""
    if not before:
        return []
    print(f"waiting for {len(before)} local agent(s) to load their models and register ...", flush=True)
    waited = 0.0
    async with MinionsClient(api_url, token) as client:
        while True:
            rows = {e["name"]: e for e in await client.executors()}
            ready = [rows[n] for n in before
                     if n in rows and rows[n]["status"] in ONLINE and rows[n]["registered_at"] != before[n]]
            if len(ready) == len(before):
                return ready
            _check_not_crash_looping([n for n in before if n not in {r["name"] for r in ready}], supervisor)
            await asyncio.sleep(REGISTER_POLL_S)
            waited += REGISTER_POLL_S
            if waited % STILL_WAITING_S < REGISTER_POLL_S:
                late = [n for n in before if n not in {r["name"] for r in ready}]
                print(f"still waiting for {', '.join(late)} to register (see {supervisor.log_dir}/agent-*.log)",
                      flush=True)


def _check_not_crash_looping(waiting_for: list[str], supervisor: Supervisor) -> None:
    """Raises AgentCrashLoop for the first of `waiting_for` (local-N, run as child agent-N) that has
    exited GIVE_UP_AFTER_EXITS times, with its exit status and the last lines of its log."""
    for name in waiting_for:
        child = supervisor.children.get(f"agent-{name.removeprefix('local-')}")
        if child is None or child.restarts < GIVE_UP_AFTER_EXITS:
            continue
        try:
            with child.log_path.open("rb") as f:  # its last few KiB: a log may be megabytes
                f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
                tail = f.read().decode(errors="replace").splitlines()[-LOG_LINES_SHOWN:]
        except OSError:
            tail = []
        quoted = "".join(f"\n    {line}" for line in tail)
        raise AgentCrashLoop(f"{name} exited {child.restarts} times before it registered (last exit status "
                             f"{child.last_code}); the end of {child.log_path}:{quoted or ' (empty)'}")


def describe_agent(executor: dict[str, Any]) -> str:
    """"local-1: cpu, bf16, batch 32 (sentence-transformers/all-MiniLM-L6-v2); kinds: embedding, sleep":
    the device, then per model loaded the precision and batch size it chose, then the kinds it takes."""
    hardware = executor.get("hardware") or {}
    loaded = []
    for p in hardware.get("precision") or ():
        batch = f", batch {p['batch_size']}" if p.get("batch_size") else ""
        loaded.append(f", {p['precision']}{batch} ({p['model']})")
    return (f"{executor['name']}: {hardware.get('device', '?')}{''.join(loaded)}; "
            f"kinds: {', '.join(executor['kinds'])}"
            + (f"; models: {', '.join(executor['models'])}" if executor.get("models") and not loaded else ""))


def _host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "") else host


def _service_env(settings: config.Settings, database_url: str, store: str, api_url: str) -> dict[str, str]:
    """The services' settings (each the ones it reads), and where the local agents connect."""
    services = settings.replace(database_url=database_url, store=store)
    return {**services.to_env(config.names_for(config.API, config.SPLITTER, config.WATCHDOG)),
            "MINIONS_API_URL": api_url, "PYTHONUNBUFFERED": "1"}


async def _executor_token(data_dir: Path, database_url: str) -> str:
    """One executor token per data dir, kept across restarts so local agents keep their rows."""
    path = data_dir / "executor.token"
    token = path.read_text().strip() if path.exists() else new_token()
    # The machine's own agents: vouched for (their results commit without a check and settle
    # volunteers' checks; sql/schema/11_checks.sql).
    await create_token(database_url, "executor", None, "minions up local agents", token, trusted=True)
    if not path.exists():
        write_secret(path, token.encode())
    return token


async def _wait_healthy(api_url: str, supervisor: Supervisor) -> None:
    if not await wait_until_healthy(api_url, 60.0):
        raise SystemExit(f"minions up: the API did not become healthy; see {supervisor.log_dir / 'api.log'}")


def _stop_on_signal() -> None:
    """SIGINT/SIGTERM at any moment, start-up included, cancel `_up`, whose `finally` stops what
    was started (agents, services, PostgreSQL). Only the first: a second signal must not cut the
    stopping short and leave a PostgreSQL behind."""
    main = asyncio.current_task()
    assert main is not None
    loop = asyncio.get_running_loop()

    def stop() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: None)
        main.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)


async def _until_signal() -> None:
    await asyncio.Event().wait()  # until _stop_on_signal cancels us


def write_secret(path: Path, data: bytes) -> None:
    """Create the file readable by its owner only from the start (no moment of wider access)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT: tighten it too


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    value = jsoncodec.loads(path.read_bytes())
    return value if isinstance(value, dict) else {}


def _write_json(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    write_secret(tmp, jsoncodec.dumps(value))
    tmp.replace(path)
    print(f"wrote {path}", file=sys.stderr)
