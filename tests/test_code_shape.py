"""The engine stays readable: no function in ``botmesh/state/`` runs over 60 lines."""

from __future__ import annotations

import ast
from pathlib import Path

STATE = Path(__file__).resolve().parents[1] / "botmesh" / "state"
LIMIT = 60


def test_no_function_in_state_is_over_60_lines() -> None:
    long = []
    for path in sorted(STATE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > LIMIT:
                    long.append(
                        f"{path.relative_to(STATE.parent)}:{node.lineno} {node.name}: {lines}"
                    )
    assert long == [], "split these by concern:\n" + "\n".join(long)
