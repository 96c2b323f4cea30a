"""The public surface is a rule, not a second hand-kept list: every public module's
``__all__`` equals the public names it really has (httpx's ``test_exported_members``)."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import pytest

import botmesh
import botmesh.state
import botmesh.state.errors

#: The modules a bot author imports from.
PUBLIC_MODULES = ["botmesh", "botmesh.errors", "botmesh.journal", "botmesh.testing"]


def _public_names(module: ModuleType) -> set[str]:
    """What a user can reach: public names, minus submodules and ``annotations``."""
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, ModuleType)
        and name != "annotations"  # ``from __future__ import annotations``
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
