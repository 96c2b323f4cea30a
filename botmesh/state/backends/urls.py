"""URL openers for the backends that have no module of their own (imported lazily)."""

from __future__ import annotations

from botmesh.state.errors import ConfigError
from botmesh.state.kv import DurableKv, MemoryKv

__all__ = ["check_memory", "open_memory"]


async def open_memory(url: str) -> DurableKv:
    """``memory://``: a new, empty ``MemoryKv``."""
    kv = MemoryKv()
    await kv.open()
    return kv


def check_memory(url: str) -> None:
    """``memory://`` takes no path and no options."""
    if url != "memory://":
        raise ConfigError("journal", f"{url!r}: the memory journal is just 'memory://'")
