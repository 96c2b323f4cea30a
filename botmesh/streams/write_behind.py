"""Write-behind: the journal writes no side effect waits for (``DEFERRED``) are applied in
memory at once and reach the changelog later, each key's latest version once.

``Deferred`` is one partition's record of them (which keys, written by which chat's work);
``Flusher`` makes them durable ``FLUSH_AFTER_S`` after the first at the latest, one flush at
a time, and says an outage once. What a flush produces, and when each write must be durable,
is the journal table's (``botmesh.streams.table_kv.TableKv.flush``); the worker's checkpoint
awaits a flush before it acknowledges a batch (``botmesh.streams.worker.checkpoint``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Container

from botmesh.state.writes import Write

__all__ = [
    "DEFERRED",
    "DEFERRED_WHEN_FRESH",
    "DEFER_MAX_BYTES",
    "FLUSH_AFTER_S",
    "LAZY_COMMIT_S",
    "Deferred",
    "Flusher",
]

log = logging.getLogger("botmesh.journal")

#: Writes no side effect waits for: ``commit`` applies them in memory (every read sees
#: them) and returns without producing anything; they go to the changelog later, each key's
#: latest version only, so writes of one key that follow each other make one changelog
#: record. (A new inbound journaled is one only when it is fresh: ``DEFERRED_WHEN_FRESH``.)
#: They go:
#:
#: - with the next awaited write of the same chat in the partition (``in_partition``'s
#:   ``chat``; work for no chat takes every chat's), before that write's own records: so
#:   the log holds a chat's writes in the order they were made (a part's ``sent`` lands
#:   before the next part is claimed);
#: - with ``flush``, which the worker awaits before it acks a batch's inbound records (so
#:   no offset is committed before the writes of its record are durable), when a
#:   partition is handed over, and ``FLUSH_AFTER_S`` after a deferred write at the latest.
#:
#: Losing them to a crash loses nothing: their records' offsets are not committed, so the
#: inbounds are read again (a done inbound answers as a duplicate; a send found in flight
#: is resolved by the ambiguity policy, as when the crash comes before its ``sent``
#: landed); a receipt not marked published is published again (receipts may come twice).
#: Under ``exactly_once`` they go into the worker's open transaction, which commits with
#: the batch's offsets (the checkpoint) or the next barrier; a transaction that fails under
#: them calls ``on_lost``.
DEFERRED = frozenset({Write.INBOX_MARK_DONE, Write.OUTBOX_MARK_SENT})
#: Deferred too when the work is for a fresh inbound record (``FRESH``: it reached its
#: partition after the worker was given the partition, so it was in flight at no earlier
#: crash): a new inbound journaled. Its record then goes out with the turn's first awaited
#: write (a send's claim, in the inbound's group record) or with the batch's flush: no
#: write of its own, and none awaited before its handlers run. A record that is not fresh
#: (it was on the log when the partition was given: a crash may have come while it ran)
#: is journaled durably before its handlers run, so a handler that kills the worker is
#: counted against the inbound's attempts (from its second run on, when it came in
#: fresh), and a message that always does ends dead, not in a crash loop.
DEFERRED_WHEN_FRESH = frozenset({Write.INBOX_JOURNAL})
#: A write of a ``DEFERRED`` label whose value is larger is awaited instead (a record the
#: broker may refuse as too large fails the write that makes it, as it always did, and
#: never waits in memory to fail the writes that would take it along).
DEFER_MAX_BYTES = 64 * 1024
#: Seconds after a deferred write before it is flushed if nothing flushed it first.
FLUSH_AFTER_S = 0.1
#: Under ``exactly_once``: seconds after a flush before its partition's transaction is
#: committed if no barrier did it first (so RocksDB gets it and a restart does not replay
#: it).
LAZY_COMMIT_S = 1.0


class Deferred(dict[str, str | None]):
    """One partition's keys whose latest write (in memory) is not produced yet, each with
    the chat whose work wrote it (``None``: no chat, or more than one)."""

    def add(self, key: str, chat: str | None) -> None:
        if key in self and self[key] != chat:
            chat = None
        self[key] = chat

    def take(self, chat: str | None) -> dict[str, str | None]:
        """The keys an awaited write of ``chat`` must produce first (all of them for no
        chat), taken out."""
        if not self:
            return {}
        if chat is None:
            taken = dict(self)
            self.clear()
            return taken
        taken = {k: c for k, c in self.items() if c is None or c == chat}
        for k in taken:
            del self[k]
        return taken

    def give_back(self, taken: dict[str, str | None], held: Container[str]) -> None:
        """Keys whose produce failed, deferred again where memory still ``held`` them
        (their latest version goes next)."""
        for key, chat in taken.items():
            if key in held:
                self.add(key, chat)


class Flusher:
    """Runs ``flush`` ``FLUSH_AFTER_S`` after ``soon`` was first called, one flush at a
    time; a flush that fails is tried again as long as ``left()`` says writes wait (said
    once an outage)."""

    def __init__(self, flush: Callable[[], Awaitable[None]], left: Callable[[], bool]) -> None:
        self._flush = flush
        self._left = left
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def soon(self) -> None:
        """Flush ``FLUSH_AFTER_S`` from now, unless a flush is due already."""
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(FLUSH_AFTER_S, self._now)

    def cancel(self) -> None:
        """No flush is due any more (a flush running goes on)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def halt(self) -> None:
        """No flush is due, and one running is cancelled and waited for (its records not
        handed to the producer yet are deferred again): what a process that dies leaves."""
        self.cancel()
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])

    def _now(self) -> None:
        self._timer = None
        if self._task is not None and not self._task.done():
            self.soon()  # one at a time: what came since goes with the next
            return
        self._task = asyncio.get_running_loop().create_task(self._quietly())

    async def _quietly(self) -> None:
        try:
            await self._flush()
        except Exception as exc:  # still deferred: the next flush tries again
            # said once per outage (it is tried again every FLUSH_AFTER_S)
            level = logging.DEBUG if self._failing else logging.WARNING
            self._failing = True
            log.log(level, "deferred journal writes not flushed yet: %s", exc)
            if self._left():
                self.soon()
        else:
            self._failing = False
