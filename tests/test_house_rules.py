"""The rules that keep the package a house of rooms, over the whole of ``botmesh/`` (the
rules of ``state/`` alone are in ``test_state_graph.py`` and ``test_code_shape.py``):

- **no import circle** between two modules, whatever the kind of import (at module level,
  inside a function, or type-only under ``if TYPE_CHECKING:``): a circle is two rooms that
  cannot be read, tested or moved one without the other;
- **no function over 60 lines** unless ``LONG`` below lists it with its reason;
- **no private attribute read across a module's walls**: outside the Kafka wing
  (``botmesh/streams/``, whose client names its error codes ``KafkaError._TRANSPORT`` and
  the like), ``x._name`` is read only where ``x`` is ``self``, ``cls`` or ``super()``, or
  where this module defines ``_name`` itself. So no module leans on another's insides, ours
  or a library's (``site._server`` of aiohttp, ``runtime._engine`` of ours).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.test_layering import module_files, read_imports

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "botmesh"
LIMIT = 60

#: The functions allowed over ``LIMIT`` lines, ``file:Class.function``, each with why it
#: reads better whole. An entry that is no longer long fails too, so the list stays true.
LONG: dict[str, str] = {
    "botmesh/streams/runner.py:InboundRunner.__init__": (
        "it stores its collaborators and the counters the worker bumps once a record "
        "(outcomes, requests, retried, actions) as plain attributes, read by name in "
        "worker/observe.py: a holder object would cost a lookup a record"
    ),
}

#: Private names of the standard library that are its documented API.
DOCUMENTED = frozenset(
    {
        "_exit",  # os._exit: end the process at once, without running cleanup
        "_replace",  # a named tuple's copy with fields changed (also urllib's SplitResult)
        "_asdict",
        "_fields",
        "_make",
    }
)
#: Where a library's private-looking names are its API: librdkafka's error codes.
KAFKA_WING = "botmesh/streams/"


def _files() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield str(path.relative_to(ROOT)), ast.parse(path.read_text(), str(path))


# -- circles -------------------------------------------------------------------------------


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports, every kind of import counted except the
    ``"package.module:attr"`` strings of the backend registry (loaded by URL, not code).
    ``from package import module`` is an import of the module; ``from package import name``
    one of the package."""
    files = module_files()
    graph: dict[str, set[str]] = {module: set() for module in files}
    for module, path in files.items():
        found = read_imports(
            path.read_text(),
            module,
            is_package=path.name == "__init__.py",
            file=str(path.relative_to(ROOT)),
        )
        by_line: dict[int, set[str]] = {}
        for imp in found:
            if imp.where != "string" and imp.name in files and imp.name != module:
                by_line.setdefault(imp.line, set()).add(imp.name)
        for names in by_line.values():
            # ``from package import module`` reads the module, not the package's face
            graph[module] |= {n for n in names if not any(m.startswith(n + ".") for m in names)}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_import_circle_anywhere() -> None:
    found = circles(import_graph())
    assert found == [], "import circles (break each with a protocol or a lower module):\n" + (
        "\n".join(" <-> ".join(group) for group in found)
    )


# -- long functions ------------------------------------------------------------------------


def long_functions() -> dict[str, int]:
    """``file:Class.function`` -> its lines, for every function over ``LIMIT``."""
    out: dict[str, int] = {}

    def walk(node: ast.AST, file: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                walk(child, file, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                if lines > LIMIT:
                    out[f"{file}:{prefix}{child.name}"] = lines
                walk(child, file, f"{prefix}{child.name}.")
            else:
                walk(child, file, prefix)

    for file, tree in _files():
        walk(tree, file, "")
    return out


def test_no_function_over_60_lines_without_a_reason() -> None:
    long = long_functions()
    unlisted = sorted(f"{name}: {lines} lines" for name, lines in long.items() if name not in LONG)
    assert unlisted == [], "split these by concern (or list why one reads better whole):\n" + (
        "\n".join(unlisted)
    )
    stale = sorted(set(LONG) - set(long))
    assert stale == [], "no longer over 60 lines, take them off LONG: " + ", ".join(stale)


# -- private attributes --------------------------------------------------------------------


def _defined_here(tree: ast.Module) -> set[str]:
    """The private names a module defines: functions, classes, attributes it assigns
    (``self._x = ...``, ``_x = ...``, ``__slots__`` entries, class-level annotations)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)  # a __slots__ entry
    return {name for name in names if name.startswith("_")}


def _owner_is_self(value: ast.expr) -> bool:
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "super"
    )


def private_reads(files: Iterator[tuple[str, ast.Module]]) -> list[str]:
    """``file:line x._name`` for each private attribute read across a module's walls."""
    bad = []
    for file, tree in files:
        if file.startswith(KAFKA_WING):
            continue
        own = _defined_here(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            name = node.attr
            if not name.startswith("_") or name.startswith("__") or name in DOCUMENTED:
                continue
            if _owner_is_self(node.value) or name in own:
                continue
            bad.append(f"{file}:{node.lineno} {ast.unparse(node)}")
    return bad


def test_no_private_attribute_is_read_across_a_modules_walls() -> None:
    bad = private_reads(_files())
    assert bad == [], "ask through a public name or a protocol instead:\n" + "\n".join(bad)


def test_the_readers_see_what_they_must() -> None:
    """Each rule above can fail: a circle, a long function, a reach are seen."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    source = (
        "import os\n"
        "class A:\n"
        "    def f(self, other, site):\n"
        "        self._mine = 1\n"
        "        os._exit(0)\n"
        "        return other._mine, site._server, super()._base()\n"
    )
    assert private_reads(iter([("botmesh/x.py", ast.parse(source))])) == [
        "botmesh/x.py:6 site._server"
    ]
    assert private_reads(iter([(KAFKA_WING + "x.py", ast.parse(source))])) == []
    graph = import_graph()
    assert "botmesh._bot.core" in graph["botmesh._bot.runtime"]
    assert "botmesh.state.engine" in graph["botmesh._bot.parts"]  # type-only included
