"""Retention: ``done`` and ``sent`` records are deleted once their ``purge`` time passed
(``retention``, default 7 days; 0 keeps them). A sent record whose receipt is not
published yet is kept until it is. Message log entries (under ``logged``, the scope's
``<scope>/log/``) are deleted once their own ``purge`` time passed
(``message_log.retention``: ``botmesh.state.message_log``); so are the names of sent
sends under their message ids (under ``named``, ``<scope>/mid/``:
``botmesh.state.statuses``), with their send."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

from botmesh.state.errors import VersionConflictError
from botmesh.state.kv import Delete, DurableKv
from botmesh.state.writes import Write

__all__ = ["PurgeAt", "Retention"]

_PURGEABLE = frozenset({"done", "sent"})

#: The purge time of a record finished at ``now`` (``None``: kept): ``Retention.purge_at``.
PurgeAt: TypeAlias = Callable[[float], float | None]


class Retention:
    def __init__(
        self,
        kv: DurableKv,
        *,
        prefix: str,
        retention: float,
        logged: str | None = None,
        named: str | None = None,
    ) -> None:
        self._kv = kv
        self._prefix = prefix
        self._retention = retention
        #: The prefixes of the message log and of the message-id names: their entries have
        #: no state; their purge time decides.
        self._stateless = tuple(p for p in (logged, named) if p)

    def purge_at(self, now: float) -> float | None:
        """When a record finished at ``now`` is purged; ``None`` when it is kept."""
        return now + self._retention if self._retention > 0 else None

    async def purge(self, now: float) -> int:
        """Delete up to 500 records (and message log entries) past their purge time;
        returns how many records (log entries not counted)."""
        kv = self._kv
        keys = await kv.range("purge", self._prefix, now, limit=500)
        if not keys:
            return 0
        entries = await kv.get_many(keys)
        stateless = self._stateless
        ops = [
            Delete(e.key, expect=e.version)
            for e in entries.values()
            if e.purge is not None
            and e.purge <= now
            and (
                (stateless and e.key.startswith(stateless))
                or (e.value.get("state") in _PURGEABLE and e.value.get("published") is not False)
            )
        ]
        if not ops:
            return 0
        try:
            await kv.commit(ops, label=Write.RETENTION_PURGE)
        except VersionConflictError:
            return 0
        # records acted on: the message log's entries and the names are indexes of what
        # was sent, not records of the engine's (deleted all the same)
        return sum(not (stateless and op.key.startswith(stateless)) for op in ops)
