"""The engine's parts take their collaborators: ``botmesh/state/engine.py`` is the one place
that wires them, so no other module of ``state/`` imports it, and the modules of ``state/``
import each other without a circle (type-only imports, under ``if TYPE_CHECKING:``,
included: a part that names ``Engine`` in a hint still reaches into all of it).
"""

from __future__ import annotations

import ast
from pathlib import Path

STATE = Path(__file__).resolve().parents[1] / "botmesh" / "state"
ENGINE = "botmesh.state.engine"
#: The modules that may import the engine: the engine itself, and the package re-exporting.
MAY_IMPORT_ENGINE = frozenset({ENGINE, "botmesh.state"})


def _module(path: Path) -> str:
    parts = path.relative_to(STATE.parents[1]).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module(path): path for path in sorted(STATE.rglob("*.py"))}


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``state/`` that ``module`` imports, wherever (functions and
    ``if TYPE_CHECKING:`` included)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join([*base, node.module] if node.module else base)
            else:
                origin = node.module or ""
            names = [origin, *(f"{origin}.{alias.name}" for alias in node.names)]
        else:
            continue
        found |= {name for name in names if name in known and name != module}
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {module: _imports(module, path, known) for module, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph``, as the path round it; ``None`` when there is none."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str] | None:
        path.append(node)
        on_path.add(node)
        for nxt in sorted(graph[node]):
            if nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in done:
                found = visit(nxt)
                if found is not None:
                    return found
        path.pop()
        on_path.discard(node)
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            found = visit(start)
            if found is not None:
                return found
    return None


def test_only_the_engine_imports_the_engine() -> None:
    importers = sorted(
        module
        for module, imported in _graph().items()
        if ENGINE in imported and module not in MAY_IMPORT_ENGINE
    )
    assert importers == [], (
        "these parts of state/ import the engine; give them the collaborators they use "
        "(engine.py wires them): " + ", ".join(importers)
    )


def test_state_imports_have_no_circle() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "an import circle in state/: " + " -> ".join(cycle or [])


def test_the_graph_reads_every_import() -> None:
    """The reading above sees what it must (else the two tests pass on nothing)."""
    graph = _graph()
    assert "botmesh.state.lease" in graph[ENGINE]
    assert "botmesh.state.records" in graph["botmesh.state.delivery"]  # ``from pkg import mod``
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
