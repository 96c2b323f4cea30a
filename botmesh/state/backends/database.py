"""``DatabaseKv``: what the database journals (sqlite, postgres, redis) do alike around their
store, once: a call on a closed journal is refused, a ``get`` is a ``get_many`` of one key,
the keys of a ``get_many`` are asked once each, and a call that asks for nothing (no keys,
``limit=0``, no operations) is answered without asking the store."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from botmesh.state.kv import Entry, IndexName, Op, wants_range

__all__ = ["DatabaseKv"]


class DatabaseKv(ABC):
    """The ``DurableKv`` calls of a database journal; a subclass asks its store (``_get_many``,
    ``_range``, ``_scan``, ``_commit``) and says whether it is open (``_check``)."""

    @abstractmethod
    async def open(self) -> None:
        """Acquire resources (files, connections). Idempotent."""

    @abstractmethod
    async def close(self) -> None:
        """Release them; later calls fail. Idempotent."""

    @abstractmethod
    def _check(self) -> object:
        """Raise ``JournalUnavailableError`` unless the journal is open."""

    async def get(self, key: str) -> Entry | None:
        return (await self.get_many([key])).get(key)

    async def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        self._check()
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        return await self._get_many(wanted)

    async def range(
        self, index: IndexName, prefix: str, until: float, limit: int = 100
    ) -> list[str]:
        self._check()
        if not wants_range(index, limit):
            return []
        return await self._range(index, prefix, until, limit)

    async def scan(self, prefix: str) -> list[Entry]:
        self._check()
        return await self._scan(prefix)

    async def commit(self, ops: Sequence[Op], *, label: str = "") -> list[int]:
        self._check()
        if not ops:
            return []
        return await self._commit(ops)

    @abstractmethod
    async def _get_many(self, keys: list[str]) -> dict[str, Entry]:
        """The entries of ``keys`` (each once, at least one) that exist."""

    @abstractmethod
    async def _range(self, index: IndexName, prefix: str, until: float, limit: int) -> list[str]:
        """``range`` with a known index and ``limit`` above 0."""

    @abstractmethod
    async def _scan(self, prefix: str) -> list[Entry]:
        """``scan``, on an open journal."""

    @abstractmethod
    async def _commit(self, ops: Sequence[Op]) -> list[int]:
        """``commit`` of at least one operation."""
