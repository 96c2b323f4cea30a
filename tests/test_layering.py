"""Imports point down. ``RULES`` below is the one statement of which of our packages may
import which (a package here is an area of the one installed ``botmesh``: its subpackages
``botmesh.state``, ``botmesh.providers``, ``botmesh.topics``, ``botmesh.observability``,
``botmesh.streams``, ``botmesh.console`` (the ops console, on ``streams``), the
front door, ``botmesh``'s own modules, and ``botmesh._cli`` (the command line, on top);
``botmesh/__init__`` itself loads nothing, so importing any area loads only that area and
what it may import); ``NO_KAFKA`` and ``LAZY`` say who never loads a Kafka client and what a
module must not load when it is imported. Everything else in this file reads those tables.

Two readings of the code check them:

- **The source (AST)** of every module under the packages of ``RULES``: every ``import`` and
  ``from ... import`` wherever it is (module level, inside functions, under
  ``if TYPE_CHECKING:``), ``importlib.import_module("...")`` / ``__import__("...")`` with a
  literal name, and ``"package.module:attr"`` strings naming one of our modules (the journal
  backend registry imports those when a URL needs them).

  ``if TYPE_CHECKING:`` imports **count for the package rules** (``RULES``, ``NO_KAFKA``):
  a type-only import is still a dependency of the code, it breaks the layering the day
  someone moves it out of the block, and mypy reads it. They **do not count as loading at
  import time** (``LAZY``), nor do imports inside functions and backend strings: the
  import-time graph is what runs when a module is imported, followed through our modules
  (parent packages included).
- **The interpreter**: each package (all its modules) and each ``LAZY`` module is imported
  in a fresh subprocess and ``sys.modules`` is read. This catches what the source cannot show
  (a third-party library that loads Kafka, a computed module name).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

# -- the rules -------------------------------------------------------------------------------

#: Which of our packages each package may import (itself always). Closed under "imports":
#: whatever a package may import, it may load through it (checked below).
RULES: dict[str, frozenset[str]] = {
    "state": frozenset(),
    "providers": frozenset({"state"}),
    "topics": frozenset({"state"}),
    "observability": frozenset({"state", "topics"}),
    "streams": frozenset({"state", "topics", "observability"}),
    "console": frozenset({"state", "topics", "observability", "streams"}),
    "_bot": frozenset({"state", "providers"}),
    "botmesh": frozenset(
        {"state", "providers", "topics", "observability", "streams", "console", "_bot"}
    ),
    # the command line (``python -m botmesh`` too), on top of everything it runs
    "_cli": frozenset(
        {"state", "providers", "topics", "observability", "streams", "console", "_bot", "botmesh"}
    ),
}
#: The Kafka client and the journal's store (and the stack retired in issue 38).
KAFKA = frozenset({"faust", "aiokafka", "confluent_kafka", "mode", "rocksdict"})
#: Packages that never import a Kafka client, anywhere (functions and TYPE_CHECKING included).
NO_KAFKA = frozenset({"state", "providers", "topics", "observability", "_bot"})
#: Importing the key loads none of these (modules, or packages with all their modules): they
#: load when a command or a URL needs them. ``botmesh`` is the front door with every public
#: name of it loaded (``from botmesh import Bot, run``).
LAZY: dict[str, frozenset[str]] = {
    "botmesh": KAFKA,  # a bot module imports botmesh: no Kafka until a worker runs
    "botmesh._cli.main": KAFKA,  # the console script: Kafka only for the commands that use it
    "botmesh.testing": KAFKA,  # a bot's unit tests run without Kafka
    "botmesh.state.backends": frozenset(
        {"botmesh.state.backends.file", "botmesh.state.backends.urls"}
    ),
}
#: What ``botmesh/__init__`` may load itself: nothing of ours but the version.
ROOT_MODULES = frozenset({"botmesh", "botmesh._version"})

# -- reading the source ------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
_TARGET = re.compile(r"^([A-Za-z_][\w.]*):[A-Za-z_]\w*$")


@dataclass(frozen=True)
class Import:
    """One import in the source: ``name`` is the module (resolved when relative)."""

    file: str
    line: int
    name: str
    #: ``module`` (runs at import time), ``function``, ``type-checking`` or ``string``.
    where: str

    @property
    def top(self) -> str:
        return area(self.name)

    def __str__(self) -> str:
        return f"{self.file}:{self.line} imports {self.name} ({self.where})"


def area(module: str) -> str:
    """The package of ``RULES`` a module of ours belongs to (``botmesh.state.kv``: ``state``;
    ``botmesh._gateway``: ``botmesh``; ``botmesh.__main__``: ``_cli``; ``botmesh`` itself:
    ``root``); another library's module: its top-level name."""
    parts = module.split(".")
    if parts[0] != "botmesh":
        return parts[0]
    if module in ROOT_MODULES:
        return "root"
    if module == "botmesh.__main__":  # python -m botmesh: the command line
        return "_cli"
    if len(parts) > 1 and parts[1] in RULES:
        return parts[1]
    if len(parts) > 1 and parts[1] == "examples":
        return "examples"
    return "botmesh"


def area_of_file(file: str) -> str:
    return area(_module_of(file))


@cache
def module_files() -> dict[str, Path]:
    """Every module of the installed package: dotted name -> file."""
    out = {}
    for file in sorted((ROOT / "botmesh").rglob("*.py")):
        parts = file.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def read_imports(source: str, module: str, *, is_package: bool, file: str) -> list[Import]:
    """Every import of ``source`` (the module ``module``), classified by where it runs."""
    known = set(module_files())
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []

    def add(node: ast.AST, name: str, where: str) -> None:
        found.append(Import(file, getattr(node, "lineno", 0), name, where))

    def resolve(level: int, name: str | None) -> str:
        if level == 0:
            return name or ""
        base = package.split(".")
        base = base[: len(base) - (level - 1)]
        return ".".join([*base, name] if name else base)

    def visit(node: ast.AST, where: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            where = "function" if where == "module" else where
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.body:
                visit(stmt, "type-checking" if where == "module" else where)
            for stmt in node.orelse:
                visit(stmt, where)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(node, alias.name, where)
        elif isinstance(node, ast.ImportFrom):
            base = resolve(node.level, node.module)
            add(node, base, where)
            for alias in node.names:  # ``from pkg import module`` imports pkg.module too
                if f"{base}.{alias.name}" in known:
                    add(node, f"{base}.{alias.name}", where)
        elif isinstance(node, ast.Call) and node.args:
            func, arg = node.func, node.args[0]
            dynamic = (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
                isinstance(func, ast.Name) and func.id in ("__import__", "import_module")
            )
            if dynamic and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                add(node, arg.value, where)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _TARGET.match(node.value)
            if match and area(match[1]) in RULES:
                add(node, match[1], "string")
        for sub in ast.iter_child_nodes(node):
            visit(sub, where)

    visit(ast.parse(source, file), "module")
    return found


@cache
def all_imports() -> tuple[Import, ...]:
    out: list[Import] = []
    for module, file in module_files().items():
        out += read_imports(
            file.read_text(),
            module,
            is_package=file.name == "__init__.py",
            file=str(file.relative_to(ROOT)),
        )
    return tuple(out)


def _parents(module: str) -> Iterator[str]:
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        yield ".".join(parts[:i])


def module_level_graph() -> dict[str, list[str]]:
    """Module -> what it imports when it is imported (module-level imports only)."""
    graph: dict[str, list[str]] = {}
    for imp in all_imports():
        if imp.where == "module":
            graph.setdefault(_module_of(imp.file), []).append(imp.name)
    return graph


def import_time_closure(root: str, graph: dict[str, list[str]] | None = None) -> set[str]:
    """Every module importing ``root`` runs, followed through ``graph`` (by default
    ``module_level_graph()``); importing ``a.b`` imports ``a`` first."""
    graph = module_level_graph() if graph is None else graph
    seen: set[str] = set()
    todo = list(_parents(root))
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            for name in graph.get(module, []):
                todo += _parents(name)
    return seen


def _module_of(file: str) -> str:
    return next(m for m, f in module_files().items() if str(f.relative_to(ROOT)) == file)


def _tops(modules: set[str]) -> set[str]:
    return {area(m) for m in modules}


def _hits(modules: set[str], banned: frozenset[str]) -> set[str]:
    return {m for m in modules if any(m == b or m.startswith(b + ".") for b in banned)}


# -- the table itself --------------------------------------------------------------------------


def test_the_table_names_every_area_we_ship() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    assert include == ["botmesh", "botmesh.*"]  # one import name (tests/kafka/test_wheel.py)
    subpackages = {f.parent.name for f in (ROOT / "botmesh").glob("*/__init__.py")}
    assert subpackages == (set(RULES) - {"botmesh"}) | {"examples"}


def test_the_rules_are_closed() -> None:
    for package, allowed in RULES.items():
        for dep in allowed:
            assert RULES[dep] <= allowed, f"{package} may import {dep}, which imports more"
    assert set(NO_KAFKA) <= set(RULES)
    assert {area(m) for m in LAZY} <= set(RULES) | {"root"}


# -- the source --------------------------------------------------------------------------------


@pytest.mark.parametrize("package", RULES)
def test_imports_point_down(package: str) -> None:
    allowed = {package} | RULES[package]
    bad = [
        str(imp)
        for imp in all_imports()
        if area_of_file(imp.file) == package and imp.top in RULES and imp.top not in allowed
    ]
    assert bad == [], f"{package} may import only {sorted(allowed)}:\n" + "\n".join(bad)


@pytest.mark.parametrize("package", sorted(NO_KAFKA))
def test_no_kafka_in_the_source(package: str) -> None:
    bad = [str(i) for i in all_imports() if area_of_file(i.file) == package and i.top in KAFKA]
    assert bad == [], f"{package} never imports Kafka clients:\n" + "\n".join(bad)


def test_only_streams_imports_kafka_clients_itself() -> None:
    """``botmesh`` reaches Kafka through ``streams`` only (DESIGN: botmesh/streams/ is the one Kafka
    importer), so a client's quirks and workarounds live in one package."""
    bad = [str(i) for i in all_imports() if i.top in KAFKA and area_of_file(i.file) != "streams"]
    assert bad == [], "import Kafka clients in botmesh/streams/ only:\n" + "\n".join(bad)


#: The Kafka stack the worker ran on before confluent-kafka (issue 38): gone from the
#: dependencies, so nothing may import it, in the package, its tests or its benchmarks.
RETIRED = frozenset({"faust", "mode", "aiokafka"})


def test_nothing_imports_faust_mode_or_aiokafka() -> None:
    """The package, the tests and the benchmarks on one Kafka client: no import of the
    retired stack anywhere (functions, ``TYPE_CHECKING`` and import strings included)."""
    bad = [str(i) for i in all_imports() if i.top in RETIRED]
    for folder in ("tests", "bench"):
        for file in sorted((ROOT / folder).rglob("*.py")):
            rel = file.relative_to(ROOT)
            parts = rel.with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found = read_imports(
                file.read_text(), module, is_package=file.name == "__init__.py", file=str(rel)
            )
            bad += [str(i) for i in found if i.top in RETIRED]
    assert bad == [], "imports of the retired Kafka stack:\n" + "\n".join(bad)


def test_the_operator_tools_and_the_worker_stand_apart() -> None:
    """``streams/ops`` (status, replay, dead letters, demo traffic) never imports the worker's
    runtime, and nothing of the worker imports the operator's tools."""
    bad = []
    for i in all_imports():
        mod = _module_of(i.file)
        ops = mod.startswith("botmesh.streams.ops")
        worker = mod.startswith("botmesh.streams.") and not ops
        if ops and i.name.startswith("botmesh.streams.worker"):
            bad.append(str(i))
        if worker and i.name.startswith("botmesh.streams.ops"):
            bad.append(str(i))
    assert bad == [], "the worker and streams/ops import each other:\n" + "\n".join(bad)


def lazy_job(module: str) -> tuple[str, ...]:
    """What a ``LAZY`` key imports: the module; for ``botmesh``, the modules its public names
    live in too (``botmesh._WHERE``)."""
    if module != "botmesh":
        return (module,)
    import botmesh

    return ("botmesh", *sorted(set(botmesh._WHERE.values())))


@pytest.mark.parametrize(("module", "banned"), LAZY.items())
def test_lazy_in_the_source(module: str, banned: frozenset[str]) -> None:
    closure: set[str] = set()
    for name in lazy_job(module):
        closure |= import_time_closure(name)
    loaded = _hits(closure, banned)
    assert loaded == set(), f"importing {module} imports {sorted(loaded)}; import them lazily"
    assert module in closure


def test_the_package_itself_loads_nothing() -> None:
    """``import botmesh.state.kv`` runs ``botmesh/__init__`` first: it must load no area."""
    closure = import_time_closure("botmesh")
    assert {m for m in closure if m in module_files()} <= ROOT_MODULES, sorted(closure)


def test_the_package_itself_loads_nothing_at_run_time(loaded: dict[str, set[str]]) -> None:
    ours = {m for m in loaded["root"] if m == "botmesh" or m.startswith("botmesh.")}
    assert ours == ROOT_MODULES, sorted(ours)


def test_the_reader_sees_every_kind_of_import() -> None:
    source = (
        "from __future__ import annotations\n"
        "import typing\n"
        "from typing import TYPE_CHECKING\n"
        "import botmesh.state.errors as e\n"
        "from . import records\n"
        "from ..state import kv\n"
        "if TYPE_CHECKING:\n"
        "    from botmesh import Bot\n"
        "else:\n"
        "    import json\n"
        "if typing.TYPE_CHECKING:\n"
        "    import faust\n"
        "def f():\n"
        "    import aiokafka\n"
        "    return importlib.import_module('botmesh.streams.faust_app.app')\n"
        "class C:\n"
        "    import mode\n"
        "    g = lambda: __import__('rocksdict')\n"
        "TARGET = 'botmesh.providers.console:open'\n"
        "DOC = 'not botmesh.state.x:y a target'\n"
    )
    found = {
        (i.name, i.where)
        for i in read_imports(source, "botmesh.topics.records", is_package=False, file="x.py")
    }
    assert found == {
        ("__future__", "module"),
        ("typing", "module"),
        ("botmesh.state.errors", "module"),
        ("botmesh.topics", "module"),
        ("botmesh.topics.records", "module"),
        ("botmesh.state", "module"),
        ("botmesh.state.kv", "module"),
        ("botmesh", "type-checking"),
        ("json", "module"),
        ("faust", "type-checking"),
        ("aiokafka", "function"),
        ("botmesh.streams.faust_app.app", "function"),
        ("mode", "module"),
        ("rocksdict", "function"),
        ("botmesh.providers.console", "string"),
    }


def test_the_closure_follows_module_level_imports_only() -> None:
    source = "import b.c\ndef f():\n    import d\nif TYPE_CHECKING:\n    import e\n"
    graph = {
        "a": [
            i.name
            for i in read_imports(source, "a", is_package=False, file="a.py")
            if i.where == "module"
        ],
        "b": ["g"],
    }
    assert import_time_closure("a", graph) == {"a", "b", "b.c", "g"}
    real = import_time_closure("botmesh._cli.main")
    assert {"botmesh", "botmesh._cli", "botmesh.state", "botmesh.state.errors"} <= real


# -- the interpreter ---------------------------------------------------------------------------


def _loaded_after(modules: tuple[str, ...]) -> set[str]:
    code = (
        "import json, sys; before = set(sys.modules)\n"
        + "".join(f"import {m}\n" for m in modules)
        + "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert out.returncode == 0, f"importing {modules} failed:\n{out.stderr}"
    return set(json.loads(out.stdout))


@pytest.fixture(scope="module")
def loaded() -> dict[str, set[str]]:
    """``sys.modules`` gained by importing each package (every module of it, ``__main__``
    excepted: it runs a program) and each ``LAZY`` module, each in a fresh interpreter."""
    jobs: dict[str, tuple[str, ...]] = {m: lazy_job(m) for m in LAZY}
    jobs["root"] = ("botmesh",)
    for package in RULES:
        jobs[f"{package}/*"] = tuple(
            m for m in module_files() if area(m) == package and not m.endswith("__main__")
        )
    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(jobs, pool.map(_loaded_after, jobs.values()), strict=True))


@pytest.mark.parametrize("package", RULES)
def test_imports_point_down_at_run_time(package: str, loaded: dict[str, set[str]]) -> None:
    ours = _tops(loaded[f"{package}/*"]) & set(RULES)
    allowed = {package} | RULES[package]
    assert ours <= allowed, f"importing {package} loads {sorted(ours - allowed)}"


@pytest.mark.parametrize("package", sorted(NO_KAFKA))
def test_no_kafka_at_run_time(package: str, loaded: dict[str, set[str]]) -> None:
    hits = _hits(loaded[f"{package}/*"], KAFKA)
    assert hits == set(), f"importing {package} loads {sorted(_tops(hits))}"


@pytest.mark.parametrize(("module", "banned"), LAZY.items())
def test_lazy_at_run_time(module: str, banned: frozenset[str], loaded: dict[str, set[str]]) -> None:
    assert module in loaded[module]
    hits = _hits(loaded[module], banned)
    assert hits == set(), f"importing {module} loads {sorted(_tops(hits))}; import them lazily"
