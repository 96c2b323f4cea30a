"""The public surface is a rule, not a second hand-kept list: every public module's
``__all__`` equals the public names it really has (httpx's ``test_exported_members``)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path
from types import ModuleType

import pytest

import botmesh
import botmesh.state
import botmesh.state.errors

ROOT = Path(__file__).resolve().parents[1]

#: The modules a bot author or an operator imports from (``botmesh.client``: a send from
#: another service; ``botmesh.settings``: every setting, ``python -m botmesh.settings``).
PUBLIC_MODULES = [
    "botmesh",
    "botmesh.client",
    "botmesh.errors",
    "botmesh.journal",
    "botmesh.settings",
    "botmesh.testing",
]
#: The channel modules: a bot imports its provider and webhook classes from each. Their
#: ``__all__`` is what the API reference documents (checked below), not every name they use.
CHANNEL_MODULES = [
    f"botmesh.providers.{channel}"
    for channel in (
        "discord", "email", "instagram", "messenger", "slack", "telegram", "twilio", "whatsapp",
    )
]  # fmt: skip


def _public_names(module: ModuleType) -> set[str]:
    """What a user can reach: public names, minus submodules, ``annotations`` and what the
    module imported from outside botmesh (``Path``, ``Mapping``: not ours to offer)."""
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, ModuleType)
        and name != "annotations"  # ``from __future__ import annotations``
        and name not in _imported_from_elsewhere(module)
    }


def _imported_from_elsewhere(module: ModuleType) -> set[str]:
    """The names ``module`` imports from outside botmesh, read from its source."""
    source = inspect.getsource(module)
    return {
        alias.asname or alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and not (node.module or "").startswith("botmesh")
        for alias in node.names
    }


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_is_every_public_name(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(module.__all__)
    for public in exported:  # the front door loads its names when first used
        getattr(module, public)
    assert exported - {"__version__"} == _public_names(module)


def test_the_front_door_stays_small() -> None:
    # 20 before flows; flows add Conversation, FlowEndedEvent, FlowTimeout, FlowCancelled
    # (a flow author catches the last two at conv.ask); a send's fallback adds Fallback and
    # FallbackEvent, the erasure of a chat ErasedEvent (every event a listener takes is here)
    assert 15 <= len(botmesh.__all__) <= 27, botmesh.__all__


def test_every_error_is_in_the_one_tree() -> None:
    from botmesh import errors

    for name in errors.__all__:
        value = getattr(errors, name)
        if isinstance(value, type) and issubclass(value, BaseException):
            assert issubclass(value, errors.BotmeshError), name
            assert name in (botmesh.state.errors.__doc__ or ""), f"{name} is not drawn in the tree"
    assert errors.__all__ == botmesh.state.errors.__all__


def test_every_state_module_declares_all() -> None:
    missing = []
    for info in pkgutil.walk_packages(botmesh.state.__path__, "botmesh.state."):
        module = importlib.import_module(info.name)
        if not info.ispkg and not hasattr(module, "__all__"):
            missing.append(info.name)
    assert missing == []


#: Where a user reads how to import us: the docs, the README and the example bots.
_USER_FACING = [
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "README.md",
    *sorted((ROOT / "botmesh" / "examples").glob("*_bot.py")),
    ROOT / "botmesh" / "examples" / "helpdesk.py",
]
#: The demo (``make run``) drives Kafka as an operator would (the catalog, the topics, the
#: demo traffic), so it may import those areas; never a private module.
_DEMO = ROOT / "botmesh" / "examples" / "demo.py"
_IMPORT = re.compile(r"^\s*(?:from\s+(botmesh[\w.]*)\s+import|import\s+(botmesh[\w.]*))", re.M)


def _imports_of(path: Path) -> list[tuple[int, str]]:
    text = path.read_text()
    return [(text.count("\n", 0, m.start()) + 1, m[1] or m[2]) for m in _IMPORT.finditer(text)]


_API_ENTRY = re.compile(r"^::: (botmesh[\w.]*)$", re.M)


def test_the_api_reference_documents_public_modules_only() -> None:
    """Each ``::: name`` of ``docs/api/`` is a public module, a name of one, or a name a
    channel module exports."""
    bad = []
    for page in sorted((ROOT / "docs" / "api").glob("*.md")):
        for name in _API_ENTRY.findall(page.read_text()):
            module, _, attr = name.rpartition(".")
            if name in PUBLIC_MODULES or module in PUBLIC_MODULES:
                continue
            if module not in CHANNEL_MODULES or attr not in importlib.import_module(module).__all__:
                bad.append(f"{page.relative_to(ROOT)}: {name}")
    assert bad == [], "document these through a public module:\n" + "\n".join(bad)


def test_users_are_shown_public_modules_only() -> None:
    """Every import of ours that the docs, the README and the example bots show names a
    module of ``PUBLIC_MODULES`` (or an example bot): a name worth showing is worth
    exporting; and the demo imports no private module."""
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _USER_FACING
        for line, module in _imports_of(path)
        if module not in PUBLIC_MODULES and not module.startswith("botmesh.examples")
    ]
    bad += [
        f"{_DEMO.relative_to(ROOT)}:{line} imports {module}"
        for line, module in _imports_of(_DEMO)
        if any(part.startswith("_") for part in module.split("."))
    ]
    assert bad == [], "export these from a public module (and show that):\n" + "\n".join(bad)
