"""The house rules hold, read from the source with `ast` (nothing here imports the code it checks):

a. no import cycle among the package's modules (minions/, services/ and agents/ under their import
   names, as tests/test_layers.py walks them), nor among bench/'s. An import counts wherever it
   sits, at the top or inside a function, and so does `importlib.import_module("...")` of a literal
   name; those under `if TYPE_CHECKING:` do not: they never run;
b. a route module of the API (one in a folder named `routes/`, or named `routes.py` or
   `<what>_routes.py`) imports no other route module: what two routes share lives beside them, not
   in one of them;
c. SQL with `$n` parameters is a gateway's: only a gateway (a `gateway.py`, or a module in a folder
   named `gateways/`) and minions/db/queries.py itself import `minions.db.queries`, make a
   `Queries(...)`, or hand `fetch`, `fetchrow`, `fetchval`, `execute`, `executemany` or a `copy_*`
   method a string literal holding `$1`, `$2`...; in the code that ships and runs in production (the
   core, the services, the agent, the CLI and the SDK). The harness (minions/testing/) and bench/ are
   exempt with tests/: they set up states and time statements by hand on purpose (a benchmark's arm
   is often the SQL itself);
d. bench/ imports nothing from tests/: what benchmarks and tests share is the harness,
   minions/testing/.

Each failure names every offender as path:line.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.test_layers import (
    PACKAGE,
    REPO,
    Module,
    _names_import_module,
    _own,
    _parse,
    _tree,
    folder_names,
    package_modules,
)

BENCH = "bench"
API = f"{PACKAGE}.services.api"
QUERIES = f"{PACKAGE}.db.queries"
# The modules allowed to hold parameterised SQL besides the gateways.
SQL_HOMES = frozenset({QUERIES, f"{PACKAGE}.db.gateway"})
SQL_METHODS = frozenset({"fetch", "fetchrow", "fetchval", "execute", "executemany"})
PARAMETER = re.compile(r"\$\d")


@dataclass(frozen=True)
class Import:
    source: Module
    line: int
    target: str
    type_only: bool  # under `if TYPE_CHECKING:`

    @property
    def where(self) -> str:
        return _where(self.source, self.line)


def _where(module: Module, line: int) -> str:
    path = module.path.relative_to(REPO) if module.path.is_relative_to(REPO) else module.path
    return f"{path}:{line}"


def bench_modules(root: Path) -> dict[str, Module]:
    """bench/'s modules (a folder of scripts, no package), named as they import: `bench.claim`."""
    modules: dict[str, Module] = {}
    for path in sorted((root / BENCH).rglob("*.py")):
        parts = [BENCH, *path.relative_to(root / BENCH).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        modules[".".join(parts)] = Module(".".join(parts), path, is_package)
    return modules


def all_modules(root: Path) -> dict[str, Module]:
    return {**package_modules(root), **bench_modules(root)}


# The package-dir folders by the names they would import as from the root: {"services": "minions.services"}.
FOLDERS = folder_names(REPO)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _nodes(tree: ast.AST, type_only: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    """Every node under `tree`, with whether it sits under `if TYPE_CHECKING:` (its `else` runs)."""
    stack: list[tuple[ast.AST, bool]] = [(tree, type_only)]
    while stack:
        node, under = stack.pop()
        yield node, under
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend((child, True) for child in node.body)
            stack.extend((child, under) for child in node.orelse)
            stack.append((node.test, under))
        else:
            stack.extend((child, under) for child in ast.iter_child_nodes(node))


def imports_of(module: Module, modules: dict[str, Module]) -> list[Import]:
    """Each import in `module`, wherever it sits, of the module it names (`from a import b` is of
    `a.b` where that is a module, else of `a`), once per line and module, in line order."""
    return sorted(set(_imports_in(module, modules)), key=lambda i: (i.line, i.target, i.type_only))


def _imports_in(module: Module, modules: dict[str, Module]) -> Iterator[Import]:
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    for node, type_only in _nodes(_parse(module.path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, node.lineno, _own(alias.name, FOLDERS), type_only)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join([*base_parts, node.module] if node.module else base_parts)
            else:
                base = _own(node.module or "", FOLDERS)
            for alias in node.names:
                child = f"{base}.{alias.name}"
                yield Import(module, node.lineno, child if child in modules else base, type_only)
        elif isinstance(node, ast.Call) and _names_import_module(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield Import(module, node.lineno, _own(first.value, FOLDERS), type_only)


def _imports(modules: dict[str, Module]) -> Iterator[Import]:
    for module in modules.values():
        yield from imports_of(module, modules)


# --- a. cycles ---------------------------------------------------------------------------------------


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module, each sorted, in name order (iterative: a
    recursion as deep as the longest import chain is not needed)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def import_cycles(imports: Iterable[Import], *, type_only: bool = False) -> list[list[Import]]:
    """The imports that tie each cycle of modules together (those under TYPE_CHECKING only if
    `type_only`), one list per strongly connected component."""
    counted = [i for i in imports if type_only or not i.type_only]
    graph: dict[str, set[str]] = {}
    for i in counted:
        if i.target != i.source.name:
            graph.setdefault(i.source.name, set()).add(i.target)
    cycles = []
    for component in strongly_connected(graph):
        members = set(component)
        ties = {(i.where, i.target): i for i in counted if i.source.name in members and i.target in members
                and i.target != i.source.name}
        cycles.append(sorted(ties.values(), key=lambda i: (i.source.name, i.line, i.target)))
    return cycles


def describe_cycles(cycles: list[list[Import]]) -> str:
    return "\n".join(
        f"cycle of {len({i.source.name for i in ties})} modules:\n"
        + "\n".join(f"  {i.where}: {i.source.name} imports {i.target}" for i in ties)
        for ties in cycles)


# --- b. route modules ---------------------------------------------------------------------------------


def is_route_module(module: Module) -> bool:
    """One of the API's in a folder named `routes/`, or named `routes.py` or `<what>_routes.py`."""
    if not module.name.startswith(f"{API}."):
        return False
    parts = module.name.split(".")
    folders = parts if module.is_package else parts[:-1]
    return "routes" in folders or (not module.is_package and (parts[-1] == "routes" or parts[-1].endswith("_routes")))


def route_imports(imports: Iterable[Import], modules: dict[str, Module]) -> list[Import]:
    """Imports of one route module by another (any import, a typing one too: the coupling is the same)."""
    return [i for i in imports if is_route_module(i.source) and i.target != i.source.name
            and i.target in modules and is_route_module(modules[i.target])]


# --- c. SQL outside a gateway ---------------------------------------------------------------------------


def is_gateway(module: Module) -> bool:
    parts = module.name.split(".")
    return (module.name in SQL_HOMES or (not module.is_package and parts[-1] == "gateway")
            or "gateways" in (parts if module.is_package else parts[:-1]))


def _literal(node: ast.expr) -> str:
    """The text of a string literal (an f-string's literal parts); '' for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    return ""


@dataclass(frozen=True)
class SqlUse:
    module: Module
    line: int
    what: str

    def __str__(self) -> str:
        return f"{_where(self.module, self.line)}: {self.what}"


def sql_uses(module: Module, modules: dict[str, Module]) -> list[SqlUse]:
    """Where `module` reaches for parameterised SQL, in line order: an import of minions.db.queries,
    a `Queries(...)`, a `$n` literal handed to a statement method."""
    return sorted(_sql_uses_in(module, modules), key=lambda use: (use.line, use.what))


def _sql_uses_in(module: Module, modules: dict[str, Module]) -> Iterator[SqlUse]:
    for i in imports_of(module, modules):
        if i.target == QUERIES or i.target.startswith(f"{QUERIES}."):
            yield SqlUse(module, i.line, f"imports {QUERIES}")
    for node, _ in _nodes(_parse(module.path)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name == "Queries":
            yield SqlUse(module, node.lineno, "makes Queries(...)")
        elif isinstance(func, ast.Attribute) and (name in SQL_METHODS or name.startswith("copy_")):
            keyword = next((k.value for k in node.keywords if k.arg == "query"), None)
            query = keyword if keyword is not None else node.args[0] if node.args else None
            if query is not None and PARAMETER.search(_literal(query)):
                yield SqlUse(module, node.lineno, f".{name}() of a $n literal")


# Test and measurement code: exempt from rule c (see above).
SQL_EXEMPT = (f"{PACKAGE}.testing", BENCH)


def sql_outside_gateways(modules: dict[str, Module]) -> list[SqlUse]:
    return [use for module in modules.values()
            if not is_gateway(module) and not _exempt(module.name) for use in sql_uses(module, modules)]


def _exempt(name: str) -> bool:
    return any(name == prefix or name.startswith(f"{prefix}.") for prefix in SQL_EXEMPT)


# --- d. bench and tests ------------------------------------------------------------------------------


def bench_imports_of_tests(imports: Iterable[Import]) -> list[Import]:
    return [i for i in imports if i.source.name.split(".")[0] == BENCH and i.target.split(".")[0] == "tests"]


# --- the rules on this repository ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def repo_modules() -> dict[str, Module]:
    return all_modules(REPO)


@pytest.fixture(scope="module")
def repo_imports(repo_modules: dict[str, Module]) -> list[Import]:
    return list(_imports(repo_modules))


def test_no_import_cycles(repo_imports: list[Import]) -> None:
    cycles = import_cycles(repo_imports)
    assert not cycles, "import cycles (TYPE_CHECKING imports not counted):\n" + describe_cycles(cycles)


def test_no_route_module_imports_another(repo_imports: list[Import], repo_modules: dict[str, Module]) -> None:
    found = route_imports(repo_imports, repo_modules)
    assert not found, "route modules importing other route modules:\n" + \
        "\n".join(f"{i.where}: {i.source.name} imports {i.target}" for i in found)


def test_parameterised_sql_only_in_gateways(repo_modules: dict[str, Module]) -> None:
    found = sql_outside_gateways(repo_modules)
    assert not found, "parameterised SQL outside a gateway (gateway.py, gateways/, minions/db/queries.py):\n" + \
        "\n".join(str(use) for use in found)


def test_bench_imports_nothing_from_tests(repo_imports: list[Import]) -> None:
    found = bench_imports_of_tests(repo_imports)
    assert not found, "bench/ importing tests/ (shared code belongs in minions/testing/):\n" + \
        "\n".join(f"{i.where}: {i.source.name} imports {i.target}" for i in found)


def test_the_walk_finds_bench_and_the_mapped_folders(repo_modules: dict[str, Module]) -> None:
    assert repo_modules["bench.claim"].path == REPO / "bench" / "claim.py"
    assert any(is_route_module(module) for module in repo_modules.values())
    assert is_gateway(repo_modules[QUERIES])


# --- the rules on a small tree, one offender of each kind --------------------------------------------------


@pytest.fixture
def small_tree(tmp_path: Path) -> dict[str, Module]:
    _tree(tmp_path, {
        "minions/__init__.py": "",
        "minions/a.py": "def late():\n    from minions import b\n",
        "minions/b.py": "import minions.a\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                        "    from minions import hints\n",
        "minions/hints.py": "from minions.b import x\n",
        "minions/c.py": "import importlib\nimportlib.import_module('minions.d')\n",
        "minions/d.py": "import typing\nif typing.TYPE_CHECKING:\n    pass\nelse:\n    import minions.c\n",
        "minions/db/__init__.py": "",
        "minions/db/queries.py": "class Queries: ...\nQ = Queries('x')\n",
        "services/__init__.py": "",
        "services/api/__init__.py": "",
        "services/api/gateway.py": "from minions.db.queries import Queries\nQ = Queries('api')\n",
        "services/api/gateways/__init__.py": "",
        "services/api/gateways/rows.py": "async def f(c):\n    await c.fetch('SELECT $1', 1)\n",
        "services/api/handlers.py": "from minions.db import queries\n\nasync def f(conn, n):\n"
                                    "    await conn.execute('SELECT $$ 1 $$')\n"
                                    "    await conn.fetchrow(f'SELECT $1 LIMIT {n}', 2)\n"
                                    "    await conn.copy_from_query(query='SELECT $2', output='x')\n"
                                    "    await conn.fetchval(n, 'SELECT $1')\n",
        # Names of no real module: the files under test move while these stay put.
        "services/api/routes/__init__.py": "",
        "services/api/routes/one.py": "from . import two\nfrom ..gateway import Q\n",
        "services/api/routes/two.py": "from minions.services.api.handlers import f\n",
        "services/api/pages/routes.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                        "    from services.api.routes import two\n",
        "services/api/extra/things_routes.py": "from ..pages import routes\nfrom .. import handlers\n",
        "agents/__init__.py": "",
        "bench/drain.py": "from bench import statements\nfrom minions.db.queries import Queries\n",
        "bench/statements.py": "import bench.drain\n\ndef fixture():\n    from tests.agent import tiny_lm\n",
    })
    return all_modules(tmp_path)


def test_each_cycle_is_found_with_the_imports_that_make_it(small_tree: dict[str, Module]) -> None:
    cycles = import_cycles(_imports(small_tree))
    assert [[(i.source.name, i.line, i.target) for i in ties] for ties in cycles] == [
        [("bench.drain", 1, "bench.statements"), ("bench.statements", 1, "bench.drain")],
        [("minions.a", 2, "minions.b"), ("minions.b", 1, "minions.a")],  # one import inside a function
        [("minions.c", 2, "minions.d"), ("minions.d", 5, "minions.c")],  # by name; under TYPE_CHECKING's else
    ]
    assert "cycle of 2 modules:\n  bench/drain.py:1: bench.drain imports bench.statements" in \
        describe_cycles(cycles).replace(str(small_tree["bench.drain"].path.parent.parent) + "/", "")


def test_an_import_for_mypy_only_makes_no_cycle(small_tree: dict[str, Module]) -> None:
    counted = {i.source.name for ties in import_cycles(_imports(small_tree)) for i in ties}
    assert "minions.hints" not in counted  # b imports hints under TYPE_CHECKING only
    with_types = import_cycles(_imports(small_tree), type_only=True)
    assert {"minions.a", "minions.b", "minions.hints"} in [{i.source.name for i in ties} for ties in with_types]


def test_each_route_import_of_a_route_is_found(small_tree: dict[str, Module]) -> None:
    found = {(i.source.name, i.line, i.target) for i in route_imports(_imports(small_tree), small_tree)}
    assert found == {
        ("minions.services.api.routes.one", 1, "minions.services.api.routes.two"),  # relatively
        ("minions.services.api.pages.routes", 3, "minions.services.api.routes.two"),  # for types only
        ("minions.services.api.extra.things_routes", 1, "minions.services.api.pages.routes"),
    }


def test_each_sql_use_outside_a_gateway_is_found(small_tree: dict[str, Module]) -> None:
    found = {(use.module.name, use.line, use.what) for use in sql_outside_gateways(small_tree)}
    assert found == {
        ("minions.services.api.handlers", 1, "imports minions.db.queries"),
        ("minions.services.api.handlers", 5, ".fetchrow() of a $n literal"),  # an f-string's text
        ("minions.services.api.handlers", 6, ".copy_from_query() of a $n literal"),  # by keyword
    }  # bench/drain.py's import is a benchmark's: exempt


def test_each_bench_import_of_tests_is_found(small_tree: dict[str, Module]) -> None:
    found = [(i.where.rpartition("/")[2], i.target) for i in bench_imports_of_tests(_imports(small_tree))]
    assert found == [("statements.py:4", "tests.agent")]
