"""The batch's checkpoint: what must be durable before an offset is acknowledged.

A consumed record's offset may be committed only once everything its settling wrote is
durable: its inbound's state and its sends' records in the journal, its receipts and dead
letters on their topics. The runner settles a chat's records in order and the chats of a
batch side by side, so a partition's records settle out of order; the committable offset of
a partition is therefore the offset of its **lowest record not settled yet** (or one past
its last record when every record handed out is settled), never the highest settled one.

:class:`Checkpoint` is that bookkeeping and the commit that follows it, in two durable
waits for a whole batch, never one a record:

1. ``flush``: the journal's deferred writes (an inbound ``done``, a send ``sent``: the
   writes no side effect waits for, ``botmesh.streams.table_kv``) are produced and made
   durable: acked by every in-sync replica under ``at_least_once``; under ``exactly_once``
   put into the worker's open transaction;
2. ``commit``: the offsets, with them: under ``at_least_once`` a synchronous offset commit
   of the consumer (after the flush's acks); under ``exactly_once`` the offsets go into the
   same transaction (``send_offsets_to_transaction``, EOS v2), which then commits, so the
   journal's writes, the receipts and the offsets become visible together or not at all.

A partition revoked or lost is forgotten (``forget``): its records still settling are not
this worker's to commit any more, and an offset of it is never committed from here again
(a zombie's commit could move the new owner's offsets back). A checkpoint with nothing to
commit does nothing (no empty transaction, no request)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["Checkpoint", "Position", "TopicPart"]

#: ``(topic, partition)``.
TopicPart = tuple[str, int]

#: What the commit step is given: the next offset to read of each partition that moved.
Commit = Callable[[Mapping[TopicPart, int]], Awaitable[None]]


@dataclass
class Position:
    """One partition's records handed out and not settled yet, and where it stands."""

    #: Offsets handed out to the runner, not settled yet.
    open: set[int] = field(default_factory=set)
    #: One past the highest offset handed out (where the partition's reading stands).
    next: int = -1
    #: The offset last committed (``-1``: none from here yet).
    committed: int = -1

    def committable(self) -> int:
        """The next offset to read once every settled record is counted: the lowest one
        still open, else one past the last handed out."""
        return min(self.open) if self.open else self.next


class Checkpoint:
    """The offsets a worker may commit, and the checkpoint that makes them durable with the
    journal's writes before it commits them (see the module's docstring)."""

    def __init__(self, flush: Callable[[], Awaitable[None]], commit: Commit) -> None:
        self._flush = flush
        self._commit = commit
        self._parts: dict[TopicPart, Position] = {}
        self._lock = asyncio.Lock()
        #: Checkpoints that committed something (the rest had nothing to commit).
        self.commits = 0

    def taken(self, topic: str, partition: int, offset: int) -> None:
        """A record handed to the runner: its offset is open until ``settled``."""
        pos = self._parts.setdefault((topic, partition), Position())
        pos.open.add(offset)
        pos.next = max(pos.next, offset + 1)

    def settled(self, topic: str, partition: int, offset: int) -> None:
        """The record is settled (its outcome or its dead letter is durable, or it will be
        by the next checkpoint's flush). A partition forgotten meanwhile is ignored."""
        pos = self._parts.get((topic, partition))
        if pos is not None:
            pos.open.discard(offset)

    def unsettled(self) -> int:
        """Records handed out and not settled, over every partition."""
        return sum(len(p.open) for p in self._parts.values())

    def forget(self, parts: Iterable[TopicPart]) -> None:
        """Partitions revoked or lost: nothing of them is committed from here any more."""
        for tp in parts:
            self._parts.pop(tp, None)

    def due(self) -> dict[TopicPart, int]:
        """The offsets a checkpoint would commit now: each partition whose committable
        offset moved past its last commit."""
        due: dict[TopicPart, int] = {}
        for tp, pos in self._parts.items():
            at = pos.committable()
            if at > pos.committed:
                due[tp] = at
        return due

    async def run(self) -> dict[TopicPart, int]:
        """Flush the journal, then commit the offsets settled so far; returns what was
        committed (empty: nothing to commit, nothing done). Raises what the flush or the
        commit raised, and then nothing is counted committed (the next checkpoint tries
        again, or the worker stops). One checkpoint at a time."""
        async with self._lock:
            due = self.due()
            if not due:
                return {}
            await self._flush()
            await self._commit(due)
            for tp, at in due.items():
                pos = self._parts.get(tp)  # forgotten while it committed: not ours now
                if pos is not None:
                    pos.committed = max(pos.committed, at)
            self.commits += 1
            return due
