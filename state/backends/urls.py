"""URL openers for the backends that have no module of their own (imported lazily)."""

from __future__ import annotations

from state.kv import DurableKv, MemoryKv

__all__ = ["open_memory"]


async def open_memory(url: str) -> DurableKv:
    """``memory://``: a new, empty ``MemoryKv``."""
    kv = MemoryKv()
    await kv.open()
    return kv
