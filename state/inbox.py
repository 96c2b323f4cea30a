"""The inbox state machine: pure transitions on inbox records, and the operator view.

::

    (journal) ──> pending ──(handlers settled)──> done ──(retention)──> purged
                    │  ▲
      (runs charged │  │ replay_inbound / lease expired
       >= max)      ▼  │
                    dead

Every transition is a compare-and-set write made by ``state.durability`` under a stable
label (``inbox.journal``, ``inbox.claim``, ``inbox.heartbeat``, ``inbox.mark_done``,
``inbox.mark_retry``, ``inbox.mark_dead``, ``inbox.replay``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from state.messages import Inbound
from state.records import InboxRecord, encode_inbound

if TYPE_CHECKING:
    from state.durability import ScopedDurability

__all__ = [
    "Inbox",
    "dead_value",
    "done_value",
    "new_value",
    "replay_value",
    "retry_value",
]

Json = dict[str, Any]


def new_value(
    message: Inbound, now: float, *, owner: str, boot: str, lease: float, media_refs: bool
) -> Json:
    """A new record, journaled and claimed in the same write (attempt 1 charged)."""
    return {
        "t": "in",
        "id": message.id,
        "state": "pending",
        "attempts": 1,
        "token": 1,
        "lease": {"owner": owner, "boot": boot, "until": now + lease},
        "message": encode_inbound(message, media_refs=media_refs),
        "error": None,
        "created": now,
        "updated": now,
    }


def done_value(value: Json, now: float) -> Json:
    new = dict(value)
    new.update(state="done", lease=None, error=None, updated=now)
    return new


def dead_value(value: Json, now: float, error: Json) -> Json:
    new = dict(value)
    new.update(state="dead", lease=None, error=error, updated=now)
    return new


def retry_value(value: Json, now: float, error: Json) -> Json:
    """A failure before the handlers: released, to be tried again after a backoff."""
    new = dict(value)
    new.update(state="pending", lease=None, error=error, updated=now)
    return new


def replay_value(value: Json, now: float) -> Json:
    """An operator's replay: pending again with a fresh attempt budget."""
    new = dict(value)
    new.update(state="pending", lease=None, error=None, attempts=0, updated=now)
    return new


class Inbox:
    """``durability.inbox``: read the inbound journal of this bot's scope."""

    def __init__(self, owner: ScopedDurability) -> None:
        self._d = owner

    async def list(self, state: str | None = None) -> list[InboxRecord]:
        """Records of this scope, optionally only those in ``state`` (``"dead"``: the DLQ)."""
        entries = await self._d.kv.scan(self._d.in_prefix)
        return [
            InboxRecord.from_value(e.value, e.version)
            for e in entries
            if state is None or e.value.get("state") == state
        ]

    async def get(self, inbound_id: str) -> InboxRecord | None:
        entry = await self._d.kv.get(self._d.in_prefix + inbound_id)
        return InboxRecord.from_value(entry.value, entry.version) if entry else None
