"""A primary and a streaming standby, both embedded PostgreSQL servers, for the failover drill.

The standby is made as in production: `pg_basebackup -R -X stream` from the primary (the wheel's
own tool), then started in standby mode; the primary then waits for it on every commit
(`synchronous_standby_names = '*'`, `synchronous_commit = on`), so a commit acknowledged to a
service is on both servers. `fail_over()` kills the primary (immediate stop: every backend dies
at once, as with a lost machine) and promotes the standby.

Services reach whichever is the primary through one multi-host URL with
`target_session_attrs=read-write` (asyncpg connects to the first host that accepts writes).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import quote

import asyncpg

from minions.db.migrate import migrate
from minions.embedded_pg import EmbeddedPostgres, bin_path, free_port


class PrimaryAndStandby:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="minions-failover-pg-"))
        self.primary = EmbeddedPostgres(self.root / "primary", fast=True)
        self.standby_dir = self.root / "standby"
        self.standby: EmbeddedPostgres | None = None

    def _password(self) -> str:
        return (self.primary.pgdata / "minions.password").read_text().strip()

    @property
    def url(self) -> str:
        """Both servers in one URL: whichever accepts writes is the one services use."""
        assert self.standby is not None
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        return f"postgresql://postgres:{quote(self._password())}@{hosts}/chaos?target_session_attrs=read-write"

    async def start(self) -> str:
        """Primary, migrated database, standby streaming synchronously; returns the multi-host URL."""
        self.primary.start()
        conn = await asyncpg.connect(self.primary.url)
        try:
            await conn.execute("CREATE DATABASE chaos")
        finally:
            await conn.close()
        await migrate(self.primary.url_for("chaos"))
        self._base_backup()
        self.standby = EmbeddedPostgres(self.standby_dir, port=free_port(), fast=True)
        self.standby.start()
        conn = await asyncpg.connect(self.primary.url)
        try:
            await conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            await conn.execute("SELECT pg_reload_conf()")
            state = await conn.fetchval("SELECT sync_state FROM pg_stat_replication")
        finally:
            await conn.close()
        assert state in ("sync", "potential", "async", None)
        return self.url

    async def sync_state(self) -> str | None:
        conn = await asyncpg.connect(self.primary.url)
        try:
            return str(await conn.fetchval("SELECT sync_state FROM pg_stat_replication"))
        finally:
            await conn.close()

    def _base_backup(self) -> None:
        self.standby_dir.mkdir(mode=0o700)
        user = self.primary.user
        if user:
            import pwd

            entry = pwd.getpwnam(user)
            os.chown(self.standby_dir, entry.pw_uid, entry.pw_gid)
            # The base backup copies the whole data folder, our root-owned password file included.
            os.chown(self.primary.pgdata / "minions.password", entry.pw_uid, entry.pw_gid)
        result = subprocess.run(
            [str(bin_path("pg_basebackup")), "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres",
             "-D", str(self.standby_dir), "-R", "-X", "stream", "-c", "fast"],
            env={**os.environ, "PGPASSWORD": self._password()}, capture_output=True, text=True, user=user,
            check=False, cwd="/",
        )
        if result.returncode != 0:
            raise RuntimeError(f"pg_basebackup failed: {result.stderr.strip()}")
        (self.standby_dir / "server.log").unlink(missing_ok=True)  # the primary's, copied along

    def fail_over(self) -> None:
        """The primary dies; the standby is promoted (`pg_ctl promote`, waits until it accepts writes)."""
        assert self.standby is not None
        self.primary.stop("immediate")
        self.standby._pg(["pg_ctl", "-D", str(self.standby.pgdata), "-w", "-t", "60", "promote"])

    def close(self) -> None:
        try:
            for server in (self.primary, self.standby):
                if server is not None:
                    server.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
