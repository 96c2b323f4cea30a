"""The outbox state machine: pure transitions on outbox records, and the operator view.

::

    (journal) ──> pending ──(provider ok)──> sent ──(retention)──> purged
                   │  ▲  ╲
     (retryable    │  │   ╲ (final error, retries spent, previous part dead)
      error)       ▼  │    ╲
                  failed ───> dead
    pending+inflight found after a crash ──> unknown (on_ambiguous="skip") or sent again

``retry_send`` moves dead, failed and unknown records back to pending; ``discard``
deletes a record. Write labels: ``outbox.journal`` (inline: journaled in flight),
``outbox.enqueue``, ``outbox.claim``, ``outbox.heartbeat``, ``outbox.mark_sent``,
``outbox.mark_failed``, ``outbox.mark_dead``, ``outbox.mark_unknown``, ``outbox.release``,
``outbox.wait``, ``outbox.retry``, ``outbox.discard``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from state.errors import RecordStateError
from state.keys import part_key
from state.kv import Delete
from state.messages import Receipt
from state.records import OutboxRecord

if TYPE_CHECKING:
    from state.durability import ScopedDurability

__all__ = [
    "Outbox",
    "dead_value",
    "failed_value",
    "new_values",
    "receipt_of",
    "retry_value",
    "sent_value",
    "unknown_value",
]

Json = dict[str, Any]


def new_values(
    key: str,
    payload: Json,
    texts: list[str | None],
    *,
    fp: str | None,
    inbound_id: str | None,
    now: float,
    lease: Json | None,
    inflight: bool,
) -> list[Json]:
    """One record per text part; part 1 in flight when ``inflight`` (inline send)."""
    values: list[Json] = []
    previous: str | None = None
    for i, text in enumerate(texts, start=1):
        k = part_key(key, i)
        values.append(
            {
                "t": "out",
                "key": k,
                "state": "pending",
                "attempts": 1 if (inflight and i == 1) else 0,
                "token": 1 if lease is not None else 0,
                "lease": lease,
                "inflight": inflight and i == 1,
                "payload": {**payload, "text": text},
                "fp": fp if i == 1 else None,
                "part": i,
                "parts": len(texts),
                "previous_part": previous,
                "inbound_id": inbound_id,
                "message_id": None,
                "error": None,
                "created": now,
                "updated": now,
            }
        )
        previous = k
    return values


def sent_value(value: Json, now: float, message_id: str) -> Json:
    new = dict(value)
    new.update(
        state="sent", message_id=message_id, inflight=False, lease=None, error=None, updated=now
    )
    return new


def failed_value(value: Json, now: float, error: Json, lease: Json | None) -> Json:
    new = dict(value)
    new.update(state="failed", inflight=False, lease=lease, error=error, updated=now)
    return new


def dead_value(value: Json, now: float, error: Json) -> Json:
    new = dict(value)
    new.update(state="dead", inflight=False, lease=None, error=error, updated=now)
    return new


def unknown_value(value: Json, now: float) -> Json:
    new = dict(value)
    new.update(
        state="unknown",
        inflight=False,
        lease=None,
        error={
            "type": "Ambiguous",
            "message": "the process stopped between calling the provider and recording it",
            "retryable": True,
        },
        updated=now,
    )
    return new


def retry_value(value: Json, now: float) -> Json:
    new = dict(value)
    new.update(state="pending", inflight=False, lease=None, error=None, attempts=0, updated=now)
    return new


def receipt_of(value: Json) -> Receipt:
    return Receipt(
        key=value["key"],
        chat_id=value["payload"]["chat_id"],
        message_id=value.get("message_id"),
        state=value["state"],
        inbound_id=value.get("inbound_id"),
        part=value.get("part", 1),
    )


class Outbox:
    """``durability.outbox``: read the outbound journal of this scope; ``discard`` a send."""

    def __init__(self, owner: ScopedDurability) -> None:
        self._d = owner

    async def list(self, state: str | None = None) -> list[OutboxRecord]:
        """Records of this scope, optionally only those in ``state`` (``"dead"``: the DLQ)."""
        entries = await self._d.kv.scan(self._d.out_prefix)
        return [
            OutboxRecord.from_value(e.value, e.version)
            for e in entries
            if state is None or e.value.get("state") == state
        ]

    async def get(self, key: str) -> OutboxRecord | None:
        entry = await self._d.kv.get(self._d.out_prefix + key)
        return OutboxRecord.from_value(entry.value, entry.version) if entry else None

    async def discard(self, key: str) -> None:
        """Forget the send ``key`` (any state). A later send under that key goes out again."""
        entry = await self._d.kv.get(self._d.out_prefix + key)
        if entry is None:
            raise RecordStateError(key, None, "no outbox record under this key in this scope")
        await self._d.kv.commit([Delete(entry.key, expect=entry.version)], label="outbox.discard")
