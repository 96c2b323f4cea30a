"""Receipts: every settled send (``sent``, ``dead``, ``unknown``) reaches the runtime's
receipts sink at least once, crash or not.

A runtime that publishes receipts (the Kafka worker: ``<prefix>.sent``) gives the engine a
``ReceiptSink``. A settled send is then journaled with ``published: false`` and a ``due``
time; its receipt goes to the sink at once, and once the sink acknowledged it the record
is marked published (``outbox.published``, one write for many records). A crash anywhere
in between leaves the record unpublished, and the next sweep publishes it again: a
receipt may arrive twice (consumers drop copies by ``key``), never not at all.
Sends that bypassed the journal get their receipt once, best effort.

**Riding with the journal.** A sink that can hand a record to its journal's producer with
the journal's own record (a ``RidingSink`` whose ``rides_with_journal`` is true: the Kafka
worker under ``exactly_once``, where both go in one transaction) gets each settled send's
receipt, and a dead send's dead letter, *with* the record that settles it (``ride``,
before that write; a dead inbound's dead letter likewise, ``ride_inbound``): the record is
journaled published at once, and the receipt commits with it or neither does. So a
``read_committed`` reader sees each receipt once; and a replay's sends answered from the
outbox publish nothing again (``replays_publish``).

**Dead letters** ride the same mark. A sink that is also a ``DeadLetterSink`` (the Kafka
worker's: ``<prefix>.outbox.dlq`` and ``<prefix>.inbound.dlq``) gets a copy of every record
the journal marks ``dead``: a dead send's record stays unpublished until its receipt *and*
its dead letter are acked, and a dead inbound is journaled ``published: false`` and marked
once its dead letter is acked. A crash between the two writes leaves the record unpublished,
so the next sweep copies it again: a dead record always has its dead letter (a copy may go
twice; ``idempotency.key`` / ``inbound.id`` headers tell the copies apart), and a dead
letter only ever follows a dead record.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from botmesh.state.basis import Basis
from botmesh.state.errors import VersionConflictError
from botmesh.state.kv import Entry, handover
from botmesh.state.messages import OutboxState, Receipt
from botmesh.state.records import InboxState, Json, receipt_of
from botmesh.state.writes import Write

__all__ = ["DeadLetterSink", "Publisher", "ReceiptSink", "RetrySink", "RidingSink"]

log = logging.getLogger("botmesh.receipts")


@runtime_checkable
class ReceiptSink(Protocol):
    """Where a runtime publishes receipts. ``publish`` hands the receipt over and returns an
    awaitable that resolves once it is durably accepted (a broker ack), or raises."""

    async def publish(self, receipt: Receipt) -> Awaitable[Any]: ...


@runtime_checkable
class DeadLetterSink(Protocol):
    """A sink that also copies dead records out (``kind``: ``"inbound"`` or ``"outbox"``;
    ``value``: the journaled record; ``source``: where the inbound was read,
    ``topic:partition:offset``, when known). Returns the awaitable of the durable accept."""

    async def dead_letter(self, kind: str, value: Json, source: str | None) -> Awaitable[Any]: ...


@runtime_checkable
class RidingSink(Protocol):
    """A sink whose records can ride with the journal's (see the module docstring):
    ``ride`` has ``receipt`` (and ``dead``: a dead send's journaled record and its
    inbound's source, for its dead letter) handed over with the next journal record that
    holds ``journal_key``'s write, and returns what takes them back (the write failed)."""

    rides_with_journal: bool

    def ride(
        self, journal_key: str, receipt: Receipt, dead: tuple[Json, str | None] | None
    ) -> Callable[[], None]: ...

    def ride_inbound(self, journal_key: str, value: Json) -> Callable[[], None]:
        """The same for a dead inbound's dead letter (``value``: its journaled record)."""
        ...


@runtime_checkable
class RetrySink(Protocol):
    """A sink that also parks failed sends for their retry (the Kafka worker's retry-tier
    topics): ``park`` hands over the journaled ``value`` of a send recorded ``failed``, due
    again at ``retry_at`` (Unix seconds); the awaitable resolves on the durable accept. A
    parked send comes back through ``Operations.retry_parked``."""

    async def park(self, value: Json, retry_at: float) -> Awaitable[Any]: ...


class Publisher:
    """Publishes the receipts (and dead letters) of one engine and records them published."""

    def __init__(self, basis: Basis, sink: ReceiptSink) -> None:
        self._basis = basis
        self._sink = sink
        self._dlq = sink if isinstance(sink, DeadLetterSink) else None
        #: Checked once, as ``_dlq``: an isinstance on a runtime Protocol is slow per send.
        self._retry = sink if isinstance(sink, RetrySink) else None
        #: journal key -> (state published, the sink's ack)
        self._pending: dict[str, tuple[str, asyncio.Future[Any]]] = {}
        self._loose: set[asyncio.Future[Any]] = set()
        self.published = 0
        #: The sink, when its receipts ride with the journal's records (``ride``).
        self._riding = sink if isinstance(sink, RidingSink) and sink.rides_with_journal else None
        #: Whether a replay's sends answered from the outbox publish their receipts again
        #: (at least once); not when they ride with the journal (each one once).
        self.replays_publish = self._riding is None

    @property
    def parks(self) -> bool:
        """Whether failed sends are parked on the sink for their retry."""
        return self._retry is not None

    async def park(self, value: Json, retry_at: float) -> bool:
        """Park a failed send (best effort: the sweeper retries it if this is lost)."""
        if self._retry is None:
            return False
        try:
            ack = asyncio.ensure_future(await self._retry.park(value, retry_at))
        except Exception as exc:
            log.warning("send %s not parked for its retry (%s)", value["key"], exc)
            return False
        self._loose.add(ack)
        ack.add_done_callback(self._loose.discard)
        return True

    @property
    def dead_letters(self) -> bool:
        """Whether dead records are copied to the sink (and journaled unpublished first)."""
        return self._dlq is not None

    @property
    def rides(self) -> bool:
        """Whether receipts ride with the journal's records (``ride``)."""
        return self._riding is not None

    async def ride(self, journal_key: str, receipt: Receipt, value: Json) -> Callable[[], None]:
        """Have ``receipt`` (and a dead send's dead letter) ride with the next journal
        record that holds ``journal_key``'s write; call it right before that write (no
        await between). Returns what takes it back (the write failed)."""
        assert self._riding is not None
        dead = None
        if self._dlq is not None and receipt.state == OutboxState.DEAD:
            dead = (value, await self._source_of(value))
        take_back = self._riding.ride(journal_key, receipt, dead)
        self.published += 1

        def back() -> None:
            take_back()
            self.published -= 1

        return back

    def ride_inbound(self, journal_key: str, value: Json) -> Callable[[], None]:
        """A dead inbound's dead letter rides with its dead record (as ``ride``)."""
        assert self._riding is not None
        return self._riding.ride_inbound(journal_key, value)

    def busy(self, key: str) -> bool:
        """Whether the record under journal key ``key`` waits for the sink's ack."""
        return key in self._pending

    async def publish(
        self, receipt: Receipt, *, journaled: bool = True, value: Json | None = None
    ) -> None:
        """Hand ``receipt`` to the sink (and, for a dead send whose record is ``value``, its
        dead letter); ``journaled``: record it published once acked."""
        try:
            ack = asyncio.ensure_future(await self._sink.publish(receipt))
            if self._dlq is not None and value is not None and receipt.state == OutboxState.DEAD:
                source = await self._source_of(value)
                copy = asyncio.ensure_future(await self._dlq.dead_letter("outbox", value, source))
                ack = asyncio.ensure_future(asyncio.gather(ack, copy))
        except Exception as exc:  # the record stays unpublished; the sweeper tries again
            log.warning("receipt of %s not handed to the sink: %s", receipt.key, exc)
            return
        self.published += 1
        if journaled:
            self._pending[self._basis.keys.outbox + receipt.key] = (receipt.state, ack)
        else:
            self._loose.add(ack)
            ack.add_done_callback(self._loose.discard)

    async def publish_inbound(self, value: Json) -> None:
        """Hand the dead letter of a dead inbound record to the sink."""
        if self._dlq is None:
            return
        try:
            ack = asyncio.ensure_future(
                await self._dlq.dead_letter("inbound", value, value.get("source"))
            )
        except Exception as exc:
            log.warning("dead letter of inbound %s not handed to the sink: %s", value["id"], exc)
            return
        self._pending[self._basis.keys.inbox + value["id"]] = (InboxState.DEAD, ack)

    async def _source_of(self, value: Json) -> str | None:
        """Where the inbound that caused a send was read, when the journal still knows."""
        inbound_id = value.get("inbound_id")
        if inbound_id is None:
            return None
        entry = await self._basis.kv.get(self._basis.keys.inbox + inbound_id)
        source = entry.value.get("source") if entry is not None else None
        return source if isinstance(source, str) else None

    async def republish(self, entry: Entry) -> int:
        """A settled record still unpublished (after a crash, or a refused receipt)."""
        if self.busy(entry.key):
            return 0
        if entry.key.startswith(self._basis.keys.inbox):
            await self.publish_inbound(entry.value)
        else:
            now = self._basis.clock.now()
            await self.publish(receipt_of(entry.value, now), value=entry.value)
        return 1

    async def flush(self, *, wait: bool = True) -> int:
        """Record published what the sink acknowledged (``wait``: wait for every receipt
        handed over so far first). Returns how many were recorded."""
        if wait and (self._pending or self._loose):
            acks = [ack for _, ack in self._pending.values()] + list(self._loose)
            await asyncio.gather(*acks, return_exceptions=True)
        done = {k: s for k, (s, ack) in self._pending.items() if ack.done()}
        if not done:
            return 0
        acked: dict[str, tuple[str, asyncio.Future[Any]]] = {}
        for key in done:
            state, ack = self._pending.pop(key)
            if ack.exception() is not None:
                log.warning("receipt of %s refused by the sink: %s", key, ack.exception())
            else:
                acked[key] = (state, ack)
        try:
            return await self._mark({key: state for key, (state, _) in acked.items()})
        except BaseException:
            # not recorded (the journal refused the write for a moment: a rebalance, the
            # broker): kept for the next flush, not published again when they fall due
            for key, held in acked.items():
                self._pending.setdefault(key, held)
            raise

    async def _mark(self, acked: dict[str, str]) -> int:
        if not acked:
            return 0
        # the receipts of every chat of the engine, whichever partition's work flushes
        # them (a partition's recovery pass does): each is recorded in its own partition
        with self._basis.across_partitions():
            return await self._record(acked)

    async def _record(self, acked: dict[str, str]) -> int:
        kv = self._basis.kv
        entries = await kv.get_many(list(acked))
        ops = [
            handover(
                entry.key,
                {**entry.value, "published": True},
                expect=entry.version,
                purge=entry.purge,
            )
            for entry in entries.values()
            if entry.value.get("published") is False
            and entry.value.get("state") == acked[entry.key]
        ]
        if not ops:
            return 0
        try:
            await kv.commit(ops, label=Write.OUTBOX_PUBLISHED)
        except VersionConflictError:  # one changed meanwhile: the others one by one
            marked = 0
            for op in ops:
                try:
                    await kv.commit([op], label=Write.OUTBOX_PUBLISHED)
                except VersionConflictError:
                    continue
                marked += 1
            return marked
        return len(ops)
