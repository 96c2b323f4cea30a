"""Retention: ``done`` and ``sent`` records are deleted once their ``purge`` time passed
(``retention``, default 7 days; 0 keeps them). A sent record whose receipt is not
published yet is kept until it is."""

from __future__ import annotations

from typing import TYPE_CHECKING

from botmesh.state.errors import VersionConflictError
from botmesh.state.kv import Delete
from botmesh.state.writes import Write

if TYPE_CHECKING:
    from botmesh.state.engine import Engine

__all__ = ["Retention"]

_PURGEABLE = frozenset({"done", "sent"})


class Retention:
    def __init__(self, engine: Engine) -> None:
        self._e = engine

    async def purge(self, now: float) -> int:
        """Delete up to 500 records past their purge time; returns how many."""
        kv = self._e.kv
        keys = await kv.range("purge", self._e.prefix, now, limit=500)
        if not keys:
            return 0
        entries = await kv.get_many(keys)
        ops = [
            Delete(e.key, expect=e.version)
            for e in entries.values()
            if e.purge is not None
            and e.purge <= now
            and e.value.get("state") in _PURGEABLE
            and e.value.get("published") is not False
        ]
        if not ops:
            return 0
        try:
            await kv.commit(ops, label=Write.RETENTION_PURGE)
        except VersionConflictError:
            return 0
        return len(ops)
