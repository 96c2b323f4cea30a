"""A conversation flow as a bot registers it (``@bot.flow(...)``): its name, body, version
and policies, checked when it is registered. The flow runner (``flow_runner.py``) runs it."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Literal, TypeVar

from botmesh.state.errors import ConfigError

__all__ = ["Flow", "FlowFn", "Incompatible", "check_flow_options"]

R = TypeVar("R")

#: A flow's body: ``async def flow(conv: Conversation) -> result`` (the conversation is
#: ``flow_runner.Conversation``, which imports this module).
FlowFn = Callable[[Any], Awaitable[R]]
#: What to do with a checkpoint this code cannot replay (another version, or diverged).
Incompatible = Literal["refuse", "restart", "drop"]
_INCOMPATIBLE = ("refuse", "restart", "drop")
_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")


class Flow(Generic[R]):
    """A registered flow (``@bot.flow(...)``): what ``ctx.start_flow`` takes."""

    def __init__(
        self,
        name: str,
        fn: FlowFn[R],
        *,
        persistent: bool,
        version: int,
        cancel: tuple[str, ...],
        on_incompatible: Incompatible,
    ) -> None:
        self.name = name
        self.fn = fn
        self.persistent = persistent
        self.version = version
        self.cancel = frozenset(cancel)
        self.on_incompatible: Incompatible = on_incompatible
        self.__name__ = getattr(fn, "__name__", name)
        self.__doc__ = getattr(fn, "__doc__", None)

    def __repr__(self) -> str:
        kind = "persistent" if self.persistent else "in-memory"
        return f"<Flow {self.name!r} v{self.version} {kind}>"


def check_flow_options(
    name: object, version: object, cancel: object, on_incompatible: object
) -> tuple[str, ...]:
    """Refuse bad ``bot.flow`` options, naming them; returns the cancel commands."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(
            "flow name",
            f"{name!r}: use 1-100 letters, digits, '_', '.', ':' or '-' (it is journaled)",
        )
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ConfigError(f"flow {name!r} version", f"expected an int >= 1, got {version!r}")
    if isinstance(cancel, str):
        raise ConfigError(
            f"flow {name!r} cancel", f"expected a tuple of commands, e.g. ({cancel!r},)"
        )
    if not isinstance(cancel, tuple | list | frozenset | set):
        raise ConfigError(f"flow {name!r} cancel", f"expected a tuple of commands, got {cancel!r}")
    commands: tuple[str, ...] = tuple(cancel)
    if not all(isinstance(c, str) and c for c in commands):
        raise ConfigError(f"flow {name!r} cancel", "every command must be a non-empty string")
    if on_incompatible not in _INCOMPATIBLE:
        raise ConfigError(
            f"flow {name!r} on_incompatible",
            f"expected 'refuse', 'restart' or 'drop', got {on_incompatible!r}",
        )
    return commands
