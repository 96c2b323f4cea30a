"""Receipts: every settled send (``sent``, ``dead``, ``unknown``) reaches the runtime's
receipts sink at least once, crash or not.

A runtime that publishes receipts (the Kafka worker: ``<prefix>.sent``) gives the engine a
``ReceiptSink``. A settled send is then journaled with ``published: false`` and a ``due``
time; its receipt goes to the sink at once, and once the sink acknowledged it the record
is marked published (``outbox.published``, one write for many records). A crash anywhere
in between leaves the record unpublished, and the next sweep publishes it again: a
receipt may arrive twice (consumers drop copies by ``key``), never not at all.
Sends that bypassed the journal get their receipt once, best effort.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from state.errors import VersionConflictError
from state.kv import Entry, handover
from state.messages import OutboxState, Receipt
from state.records import receipt_of
from state.writes import Write

if TYPE_CHECKING:
    from state.engine import Engine

__all__ = ["Publisher", "ReceiptSink"]

log = logging.getLogger("botmesh.receipts")


@runtime_checkable
class ReceiptSink(Protocol):
    """Where a runtime publishes receipts. ``publish`` hands the receipt over and returns an
    awaitable that resolves once it is durably accepted (a broker ack), or raises."""

    async def publish(self, receipt: Receipt) -> Awaitable[Any]: ...


class Publisher:
    """Publishes the receipts of one engine and records them published."""

    def __init__(self, engine: Engine, sink: ReceiptSink) -> None:
        self._e = engine
        self._sink = sink
        #: key -> (state published, the sink's ack)
        self._pending: dict[str, tuple[OutboxState, asyncio.Future[Any]]] = {}
        self._loose: set[asyncio.Future[Any]] = set()
        self.published = 0

    def busy(self, key: str) -> bool:
        return key in self._pending

    async def publish(self, receipt: Receipt, *, journaled: bool = True) -> None:
        try:
            ack = asyncio.ensure_future(await self._sink.publish(receipt))
        except Exception as exc:  # the record stays unpublished; the sweeper tries again
            log.warning("receipt of %s not handed to the sink: %s", receipt.key, exc)
            return
        self.published += 1
        if journaled:
            self._pending[receipt.key] = (receipt.state, ack)
        else:
            self._loose.add(ack)
            ack.add_done_callback(self._loose.discard)

    async def republish(self, entry: Entry) -> int:
        """A settled record still unpublished (after a crash, or a refused receipt)."""
        if self.busy(entry.value["key"]):
            return 0
        await self.publish(receipt_of(entry.value, self._e.clock.now()))
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
        acked: dict[str, OutboxState] = {}
        for key, state in done.items():
            _, ack = self._pending.pop(key)
            if ack.exception() is not None:
                log.warning("receipt of %s refused by the sink: %s", key, ack.exception())
            else:
                acked[key] = state
        return await self._mark(acked)

    async def _mark(self, acked: dict[str, OutboxState]) -> int:
        if not acked:
            return 0
        # the receipts of every chat of the engine, whichever partition's work flushes
        # them (a partition's recovery pass does): each is recorded in its own partition
        with self._e.across_partitions():
            return await self._record(acked)

    async def _record(self, acked: dict[str, OutboxState]) -> int:
        e = self._e
        entries = await e.kv.get_many([e.out_prefix + k for k in acked])
        ops = [
            handover(
                entry.key,
                {**entry.value, "published": True},
                expect=entry.version,
                purge=entry.purge,
            )
            for entry in entries.values()
            if entry.value.get("published") is False
            and entry.value.get("state") == acked[entry.value["key"]]
        ]
        if not ops:
            return 0
        try:
            await e.kv.commit(ops, label=Write.OUTBOX_PUBLISHED)
        except VersionConflictError:  # one changed meanwhile: the others one by one
            marked = 0
            for op in ops:
                try:
                    await e.kv.commit([op], label=Write.OUTBOX_PUBLISHED)
                except VersionConflictError:
                    continue
                marked += 1
            return marked
        return len(ops)
