"""Files and folders only their owner may read: the local store's objects (every team's inputs and
results), its temporary uploads, and the logs of `minions up`. Created with their final mode (0700
folders, 0600 files), so there is no moment of wider access, whatever the process's umask."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def make_private_dir(path: Path) -> None:
    """Create `path` and each missing parent as 0700 (Path.mkdir(parents=True) would give the parents
    the umask's mode). Folders that exist are left as they are: see `tighten`."""
    if path.is_dir():
        return
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):  # a concurrent writer made it first (also 0700)
            folder.mkdir(mode=DIR_MODE)


def tighten(path: Path, mode: int) -> bool:
    """chmod an existing file or folder of ours that others may read (made by an older version) to
    `mode`; True when it changed. Someone else's (a shared folder an operator chose) is left alone."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    if st.st_uid != os.geteuid() or st.st_mode & 0o777 == mode:
        return False
    os.chmod(path, mode)
    return True


def open_private(path: Path, flags: int) -> int:
    """os.open with FILE_MODE for a file it creates; a file that existed is tightened too."""
    fd = os.open(path, flags | os.O_CREAT, FILE_MODE)
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o077 and st.st_uid == os.geteuid():
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd
