"""`minions logs [SERVICE] [-f]`: the log files of a local `minions up` (its data dir's logs/,
one file per service or agent, rotated by size: minions/cli/child_logs.py).

Without SERVICE, every log's last lines, each under its name; with -f, then what they write next,
each line prefixed by its service when there are several. Follows a log through its rotation (a
new file under the name) as `tail -F` does."""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from minions.up_json import DEFAULT_DATA_DIR, read_up_json

POLL_S = 0.25
BLOCK = 1 << 16


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("logs", help="show the logs of a local `minions up` (-f follows them)",
                       description="The log files of the services and agents a `minions up` runs.")
    p.add_argument("service", nargs="?", default=None,
                   help="api, splitter, watchdog, agent-1, ... (default: every one)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing what they write, until Ctrl-C")
    p.add_argument("-n", "--lines", type=int, default=40, help="last lines of each log to show first")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="the data dir of that `minions up` (default: ./.minions if it has logs, else the "
                        "data dir of the `minions up` running on this machine)")
    p.set_defaults(handler=run)


def logs_dir(data_dir: Path | None) -> Path:
    """The logs folder of the `minions up` of `data_dir`, else of here, else the running one."""
    if data_dir is not None:
        return data_dir / "logs"
    if (DEFAULT_DATA_DIR / "logs").is_dir():
        return DEFAULT_DATA_DIR / "logs"
    published = read_up_json(None).get("data_dir")
    return Path(published) / "logs" if published else DEFAULT_DATA_DIR / "logs"


def last_lines(path: Path, count: int) -> list[bytes]:
    """The last `count` lines of a file, read backwards in blocks (a log can be large)."""
    if count <= 0:
        return []
    with path.open("rb") as f:
        end = f.seek(0, os.SEEK_END)
        data = b""
        while end > 0 and data.count(b"\n") <= count:
            start = max(0, end - BLOCK)
            f.seek(start)
            data = f.read(end - start) + data
            end = start
    return data.splitlines()[-count:]


@dataclass
class Followed:
    """One log file followed by name: reopened when rotation puts a new file there."""

    name: str
    path: Path
    file: IO[bytes] | None = None
    inode: int = 0
    pending: bytes = b""

    def open_at_end(self) -> None:
        if self.path.exists():
            self.file = self.path.open("rb")
            self.file.seek(0, os.SEEK_END)
            self.inode = os.fstat(self.file.fileno()).st_ino

    def new_lines(self) -> list[bytes]:
        lines = self._read()
        try:
            inode = self.path.stat().st_ino
        except FileNotFoundError:
            return lines
        if self.file is None or inode != self.inode:
            # Rotated (or created): the old file's last lines (written before the rename), then
            # the new one from its start.
            if self.file is not None:
                lines += self._read()
                self.file.close()
                self.pending = b""
            self.file, self.inode = self.path.open("rb"), inode
            lines += self._read()
        return lines

    def _read(self) -> list[bytes]:
        if self.file is None:
            return []
        *lines, self.pending = (self.pending + self.file.read()).split(b"\n")
        return lines


def run(args: argparse.Namespace) -> int:
    folder = logs_dir(args.data_dir)
    available = sorted(p.stem for p in folder.glob("*.log"))
    if not available:
        print(f"minions logs: no logs in {folder}: is `minions up` running here? (or pass --data-dir)",
              file=sys.stderr)
        return 1
    if args.service is not None and args.service not in available:
        print(f"minions logs: no log named {args.service!r} in {folder} (there are: {', '.join(available)})",
              file=sys.stderr)
        return 1
    names = [args.service] if args.service else available
    out = sys.stdout.buffer
    for name in names:
        if len(names) > 1:
            out.write(f"==> {name} <==\n".encode())
        for line in last_lines(folder / f"{name}.log", args.lines):
            out.write(line + b"\n")
    out.flush()
    if not args.follow:
        return 0
    return _follow([Followed(n, folder / f"{n}.log") for n in names], prefixed=len(names) > 1)


def _follow(logs: list[Followed], *, prefixed: bool) -> int:
    for log in logs:
        log.open_at_end()
    out = sys.stdout.buffer
    try:
        while True:
            for log in logs:
                for line in log.new_lines():
                    out.write((f"{log.name} | ".encode() if prefixed else b"") + line + b"\n")
            out.flush()
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        return 0  # Ctrl-C is how following ends
    except BrokenPipeError:  # `minions logs -f | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
