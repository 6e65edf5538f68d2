"""The layers hold: every import of the package's own code points the way the layers allow.

The package is one import name, `minions`; `services/` and `agents/` join it through setuptools'
package-dir (pyproject.toml: `minions.services` is the folder `services/`), so
`from minions.services.api import errors` reads like any other import of the package and nothing at
import time tells a service from the core. This test reads the source of every module (minions/,
plus each package-dir folder, named as the package it maps to) with `ast`: imports at the top,
inside functions and under TYPE_CHECKING, relative imports, and `importlib.import_module("...")` of a
literal name. It fails naming each import that points the wrong way (docs/ARCHITECTURE.md, "Layer
rules"):

| layer           | where                              | may import                         |
|-----------------|------------------------------------|------------------------------------|
| core            | minions/ but cli/, sdk/, testing/  | the core                           |
| SDK             | minions/sdk/                       | the core                           |
| CLI             | minions/cli/                       | the core, the SDK                  |
| service NAME    | services/NAME/                     | the core (and its own modules)     |
| agent           | agents/                            | the core                           |
| harness         | minions/testing/                   | anything (imported by tests/ and bench/ only) |
"""

from __future__ import annotations

import ast
import concurrent.futures
import os
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "minions"

CORE, SDK, CLI, AGENT, HARNESS = "core", "SDK", "CLI", "agent", "harness"
SERVICES_ROOT = "services package"  # minions.services itself, services/__init__.py (empty)


@dataclass(frozen=True)
class Module:
    name: str  # dotted, as it imports: minions.services.api.http.errors
    path: Path  # its source file where it really lies: services/api/http/errors.py
    is_package: bool


@dataclass(frozen=True)
class Arrow:
    source: Module
    line: int
    target: str

    def __str__(self) -> str:
        where = self.source.path.relative_to(REPO) if self.source.path.is_relative_to(REPO) else self.source.path
        return (f"{where}:{self.line}: {layer_of(self.source.name)} imports {self.target} "
                f"({layer_of(self.target)})")


def _pyproject(root: Path) -> dict[str, Any]:
    return tomllib.loads((root / "pyproject.toml").read_text())


def package_folders(root: Path) -> dict[str, Path]:
    """Where each package's folder lies under `root`, as setuptools maps it: `minions` in minions/,
    then each entry of [tool.setuptools.package-dir] (`minions.services` in services/)."""
    mapped = _pyproject(root)["tool"]["setuptools"]["package-dir"]
    return {PACKAGE: root / PACKAGE, **{name: root / folder for name, folder in mapped.items()}}


def package_modules(root: Path) -> dict[str, Module]:
    """Every module of the package under `root`, named as it imports: each folder of package_folders
    walked under its package's name."""
    modules: dict[str, Module] = {}
    folders = package_folders(root)
    for name, folder in folders.items():
        _walk(folder, name.split("."), modules, set(folders))
    return modules


def _walk(folder: Path, prefix: list[str], modules: dict[str, Module], mapped: set[str]) -> None:
    for dirpath, dirnames, filenames in os.walk(folder):
        # A subfolder named like a package that package-dir puts elsewhere is not that package (as
        # for setuptools): its modules are read from the mapped folder only.
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and ".".join(
            [*prefix, *(Path(dirpath) / d).relative_to(folder).parts]) not in mapped)
        for filename in sorted(filenames):
            if not filename.endswith(".py"):
                continue
            path = Path(dirpath) / filename
            parts = [*prefix, *path.relative_to(folder).with_suffix("").parts]
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            modules[".".join(parts)] = Module(".".join(parts), path, is_package)


def layer_of(name: str) -> str:
    parts = name.split(".")
    if len(parts) == 1:
        return CORE
    match parts[1]:
        case "services":
            return f"service {parts[2]}" if len(parts) > 2 else SERVICES_ROOT
        case "agents":
            return AGENT
        case "cli":
            return CLI
        case "sdk":
            return SDK
        case "testing":
            return HARNESS
    return CORE


def allowed(source: str, target: str) -> bool:
    """May a module of layer `source` import one of layer `target`? (the table above)"""
    return (target in (source, CORE) or source == HARNESS or (source == CLI and target == SDK)
            or (source.startswith("service ") and target == SERVICES_ROOT))


def _parse(path: Path) -> ast.Module:
    """The file's syntax tree. CPython 3.11 before 3.11.8 (gh-106905) can refuse a parse with
    "AST constructor recursion depth mismatch" in a thread where an earlier parse ran out of
    recursion (the suite's fuzzers get there): a fresh thread starts with a fresh count."""
    source = path.read_bytes()
    try:
        return ast.parse(source, filename=str(path))
    except SystemError:
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(ast.parse, source, str(path)).result()


def folder_names(root: Path) -> dict[str, str]:
    """The package each package-dir folder is, by the name the folder would import as from `root`:
    {"services": "minions.services", ...}. `import services.api` is the same code as minions.services.api."""
    return {".".join(folder.relative_to(root).parts): name for name, folder in package_folders(root).items()
            if name != PACKAGE}


def imports_of(module: Module, modules: dict[str, Module], folders: dict[str, str]) -> Iterator[tuple[int, str]]:
    """(line, module name) of each import of the package's own code in `module`, wherever it sits;
    `folders` is folder_names()."""
    tree = _parse(module.path)
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, _own(alias.name, folders)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join([*base_parts, node.module] if node.module else base_parts)
            else:
                base = _own(node.module or "", folders)
            for alias in node.names:
                child = f"{base}.{alias.name}"
                yield node.lineno, child if child in modules else base
        elif isinstance(node, ast.Call) and _names_import_module(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield node.lineno, _own(first.value, folders)


def _own(name: str, folders: dict[str, str]) -> str:
    """`services.api.x` and `agents.x` (the mapped folders by their names from the root) are the package's."""
    for folder, package in folders.items():
        if name == folder or name.startswith(f"{folder}."):
            return package + name[len(folder):]
    return name


def _names_import_module(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or \
        (isinstance(func, ast.Name) and func.id in ("import_module", "__import__"))


def wrong_way_arrows(root: Path) -> list[Arrow]:
    modules, folders = package_modules(root), folder_names(root)
    arrows: dict[Arrow, None] = {}  # one per line and target, however many names the line imports
    for module in modules.values():
        source = layer_of(module.name)
        for line, target in imports_of(module, modules, folders):
            if target.split(".")[0] == PACKAGE and not allowed(source, layer_of(target)):
                arrows[Arrow(module, line, target)] = None
    return list(arrows)


def test_no_import_points_the_wrong_way() -> None:
    arrows = wrong_way_arrows(REPO)
    assert not arrows, "imports against the layers (docs/ARCHITECTURE.md, Layer rules):\n" + \
        "\n".join(str(arrow) for arrow in arrows)


def test_the_walk_reads_the_mapped_folders_under_their_package_names() -> None:
    modules = package_modules(REPO)
    api = modules["minions.services.api.app"]
    assert api.path == REPO / "services" / "api" / "app.py"
    assert modules["minions.agents.macos.agent"].path == REPO / "agents" / "macos" / "agent.py"
    assert {layer_of(name) for name in modules} >= {CORE, SDK, CLI, AGENT, HARNESS, "service api",
                                                    "service splitter", "service watchdog"}
    # Each file has one path: no link under minions/ gives services/ or agents/ a second one.
    assert not [path for path in (REPO / PACKAGE).rglob("*") if path.is_symlink()]


def test_the_wheel_ships_every_package_the_walk_reads() -> None:
    """[tool.setuptools] packages is a list (setuptools' find cannot see through package-dir): a
    package folder left out of it still imports in a checkout, through the editable install's finder,
    and is missing from the wheel."""
    listed = set(_pyproject(REPO)["tool"]["setuptools"]["packages"])
    assert listed == {module.name for module in package_modules(REPO).values() if module.is_package}


def test_mypy_checks_every_mapped_folder_of_code() -> None:
    """mypy reaches a package-dir folder only by its package name ([tool.mypy] packages, through the
    view .ci/mypy-view makes); one holding modules but left out is checked only where imported."""
    config = _pyproject(REPO)
    checked = set(config["tool"]["mypy"]["packages"])
    modules = package_modules(REPO)
    with_code = {name for name in config["tool"]["setuptools"]["package-dir"]
                 if any(module.startswith(f"{name}.") for module in modules)}
    assert with_code <= checked


def _tree(root: Path, files: dict[str, str]) -> None:
    for relative, source in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    (root / "pyproject.toml").write_text(
        '[tool.setuptools.package-dir]\n"minions.services" = "services"\n"minions.agents" = "agents"\n')


@pytest.fixture
def small_tree(tmp_path: Path) -> Path:
    """A package laid out like ours, one arrow of each wrong kind and one of each allowed kind."""
    _tree(tmp_path, {
        "minions/__init__.py": "",
        "minions/records.py": "def lazily():\n    from minions.services.api import handlers\n",
        "minions/cli/__init__.py": "",
        "minions/cli/connection.py": "from minions.sdk import client\nfrom minions import records\n",
        "minions/sdk/__init__.py": "",
        "minions/sdk/client.py": "from minions import records\n\ndef bar():\n    from ..cli import connection\n",
        "minions/testing/__init__.py": "",
        "minions/testing/processes.py": "import minions.services.api.handlers\n"
                                        "from minions.agents.macos import agent\n",
        "services/__init__.py": "",
        "services/api/__init__.py": "",
        "services/api/handlers.py": "from . import routes\nfrom ..splitter.cutter import cut\n"
                                    "from minions import records\n",
        "services/api/routes.py": "import importlib\nimportlib.import_module('minions.services.watchdog')\n",
        "services/splitter/__init__.py": "",
        "services/splitter/cutter.py": "from minions.records import lazily\ncut = lazily\n",
        "services/watchdog/__init__.py": "from minions.cli import connection\n",
        "agents/__init__.py": "",
        "agents/macos/__init__.py": "",
        "agents/macos/agent.py": "from typing import TYPE_CHECKING\n"
                                 "if TYPE_CHECKING:\n    import services.splitter.cutter\n",
    })
    return tmp_path


def test_each_wrong_way_arrow_is_found_and_named(small_tree: Path) -> None:
    found = {(arrow.source.name, arrow.line, arrow.target) for arrow in wrong_way_arrows(small_tree)}
    assert found == {
        ("minions.records", 2, "minions.services.api.handlers"),  # the core imports a service, in a function
        ("minions.sdk.client", 4, "minions.cli.connection"),  # the SDK imports the CLI, relatively
        ("minions.services.api.handlers", 2, "minions.services.splitter.cutter"),  # a service another
        ("minions.services.api.routes", 2, "minions.services.watchdog"),  # by name, at run time
        ("minions.services.watchdog", 1, "minions.cli.connection"),  # a service the CLI
        ("minions.agents.macos.agent", 3, "minions.services.splitter.cutter"),  # the agent a service
    }


def test_an_arrow_names_the_file_where_it_really_lies(small_tree: Path) -> None:
    arrows = {arrow.source.name: arrow for arrow in wrong_way_arrows(small_tree)}
    handlers = arrows["minions.services.api.handlers"]
    assert handlers.source.path == small_tree / "services" / "api" / "handlers.py"
    assert "service api imports minions.services.splitter.cutter (service splitter)" in str(handlers)
