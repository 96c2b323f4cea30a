"""The worker's sink (``KafkaReceipts``): what the runtime hands to Kafka besides its
journal, through the worker's one producer. Receipts go to ``<prefix>.sent`` keyed by chat
id, failed sends parked on their retry tier, and the journal's own dead records copied to
``<prefix>.outbox.dlq`` / ``<prefix>.inbound.dlq``; each call returns the broker's ack.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from botmesh.observability.tracing import TRACE_HEADERS
from botmesh.state.messages import Receipt
from botmesh.state.records import Json
from botmesh.streams.retry_tiers import parked_record
from botmesh.streams.table_kv import Rider
from botmesh.topics.dead_letters import inbound_dead_letter, outbox_dead_letter
from botmesh.topics.records import chat_key, encode_receipt

__all__ = ["Headers", "KafkaReceipts", "Produce"]

Headers = list[tuple[str, bytes]]
#: ``produce(role, key, value, headers)`` hands a record to the producer (role ``"sent"``,
#: ``"dlq"``, ``"requests-dlq"``, ``"outbox-dlq"``, ``"control-results"`` or
#: ``"retry:<tier>"``) and returns an awaitable that resolves on the broker's ack.
Produce = Callable[[str, bytes | None, bytes, Headers], Awaitable[Awaitable[Any]]]


class KafkaReceipts:
    """The runtime's ``ReceiptSink``: each receipt goes to ``<prefix>.sent``, keyed by
    chat id; ``publish`` returns the broker-ack future (the producer uses acks=all).

    ``ride_with``: under ``exactly_once`` on the Kafka journal, its ``TableKv.ride``. A
    settled send's receipt (and a dead one's dead letter) then rides with the journal
    record that settles it, in the same transaction (``ride``; the sink is then a
    ``botmesh.state.receipts.RidingSink``): a ``read_committed`` reader sees each receipt
    once, and the record never waits to be marked published."""

    def __init__(
        self,
        produce: Produce,
        letters: Counter[tuple[str, str]] | None = None,
        *,
        ride_with: Callable[[str, Rider], Callable[[], None]] | None = None,
    ) -> None:
        self._produce = produce
        self._ride_with = ride_with
        #: Whether ``ride`` may be used (``botmesh.state.receipts.Publisher`` asks).
        self.rides_with_journal = ride_with is not None
        self.published = 0
        self.dead_letters = 0
        self.parked = 0
        #: Dead letters produced, by (kind, reason) (shared with the runner's).
        self.letters: Counter[tuple[str, str]] = Counter() if letters is None else letters

    async def publish(self, receipt: Receipt) -> Awaitable[Any]:
        key, value = chat_key(receipt.chat_id), encode_receipt(receipt)
        ack = await self._produce("sent", key, value, [*TRACE_HEADERS.get()])
        self.published += 1
        return ack

    def ride(
        self, journal_key: str, receipt: Receipt, dead: tuple[Json, str | None] | None
    ) -> Callable[[], None]:
        """Have ``receipt`` (and, for a dead send, its dead letter: its record and the
        inbound's source) produced with the next changelog record that holds
        ``journal_key``'s write; what it returns takes them back."""
        assert self._ride_with is not None, "ride() needs ride_with"
        key, value = chat_key(receipt.chat_id), encode_receipt(receipt)
        headers = [*TRACE_HEADERS.get()]

        async def rider() -> Awaitable[Any]:
            ack = await self._produce("sent", key, value, headers)
            self.published += 1
            if dead is None:
                return ack
            copy = await self.dead_letter("outbox", dead[0], dead[1])
            return asyncio.gather(ack, copy)

        return self._ride_with(journal_key, rider)

    def ride_inbound(self, journal_key: str, value: Json) -> Callable[[], None]:
        """A dead inbound's dead letter, with the next changelog record holding its dead
        record (``journal_key``); what it returns takes it back."""
        assert self._ride_with is not None, "ride_inbound() needs ride_with"
        source = value.get("source")

        async def rider() -> Awaitable[Any]:
            return await self.dead_letter(
                "inbound", value, source if isinstance(source, str) else None
            )

        return self._ride_with(journal_key, rider)

    async def park(self, value: Json, retry_at: float) -> Awaitable[Any]:
        """A failed send parked on its retry tier (``botmesh.streams.retry_tiers``) until
        ``retry_at``; the broker-ack future."""
        tier, key, body, headers = parked_record(value, retry_at)
        ack = await self._produce(f"retry:{tier}", key, body, headers)
        self.parked += 1
        return ack

    async def dead_letter(self, kind: str, value: Json, source: str | None) -> Awaitable[Any]:
        """The journal's dead record ``value`` (``kind``: ``"outbox"``, a dead send, or
        ``"inbound"``) copied to ``<prefix>.outbox.dlq`` / ``<prefix>.inbound.dlq`` with the
        headers of ``botmesh.topics.dead_letters``; the broker-ack future."""
        if kind == "outbox":
            key, body, headers = outbox_dead_letter(value, source)
            role = "outbox-dlq"
        else:
            key, body, headers = inbound_dead_letter(value, source)
            role = "dlq"
        ack = await self._produce(role, key, body, headers)
        self.dead_letters += 1
        error = value.get("error")
        reason = error.get("reason") if isinstance(error, dict) else None
        self.letters[(kind, str(reason or "unknown"))] += 1
        return ack
