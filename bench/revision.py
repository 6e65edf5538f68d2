"""Another revision of this repository, checked out beside it for a benchmark's arm: an older agent
run against this tree's services, to say what a change did, in one run, alternating.

    with checkout("a3bf2a5") as root:   # a detached `git worktree` in a temporary folder
        fleet = AgentFleet(services, token, root=root)

The worktree shares this repository's objects (nothing is copied but the files) and is removed
afterwards, whatever happens. Its `minions` package is the one its processes import: they run with
the worktree as their working directory and PYTHONPATH, and links in its minions/ put its own
services/ and agents/ there (see _map_folders).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def describe(rev: str) -> str:
    """`abbrev subject` of a revision, for the report."""
    return _git("log", "-1", "--format=%h %s", rev).strip()


@contextlib.contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """The revision's tree in a temporary detached worktree (its root), removed on the way out."""
    folder = Path(tempfile.mkdtemp(prefix="minions-rev-"))
    tree = folder / "tree"
    _git("worktree", "add", "--detach", "--quiet", str(tree), rev)
    try:
        _map_folders(tree)
        yield tree
    finally:
        _git("worktree", "remove", "--force", str(tree))
        shutil.rmtree(folder, ignore_errors=True)


def _map_folders(tree: Path) -> None:
    """Links the revision's package-dir folders into its minions/ (minions/agents -> ../agents).

    On PYTHONPATH the worktree's minions/ holds no services/ or agents/ (pyproject.toml maps them in),
    and the import hook of this checkout's editable install would answer for minions.agents with this
    checkout's folder: an old agent run with today's agent code. The worktree is thrown away after,
    so the links never reach a commit; revisions from before package-dir carry such links already."""
    pyproject = tomllib.loads((tree / "pyproject.toml").read_text())
    for package, folder in pyproject.get("tool", {}).get("setuptools", {}).get("package-dir", {}).items():
        link = tree.joinpath(*package.split("."))
        if package and not link.exists() and not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(tree / folder, link.parent), target_is_directory=True)


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout
