"""The worker's journal: the ``DurableKv`` SPI over a table stored in RocksDB and
changelogged to Kafka (``<prefix>.worker-journal-changelog``, compacted).

**The journal follows the partition.** The changelog has as many partitions as the inbound
topic, and a chat's records (its inbox, outbox and lease records) live in the changelog
partition of the chat's inbound partition. Whichever worker owns inbound partition ``p``
owns changelog partition ``p``: the worker restores the partition's RocksDB database from
the changelog before it reads the next inbound record of ``p``
(``botmesh.streams.worker.restore``), and the journal then opens the partition (``assign``)
and runs the engine's recovery pass over it (leases the old owner left are reclaimed once
they expire, or at once when this instance held them; sends left in flight are resolved by
the ambiguity policy). A revoked
partition is dropped (``revoke``): a later write of its records by this worker is refused
(a lease holder's write becomes ``FencedError``, counted in ``staleLeases``).

**The records live on disk.** A partition's records, and its ``due`` and ``purge`` indexes
in (score, key) order, are in its RocksDB database (``botmesh.streams.journal_db``); a read
goes there unless memory holds a newer version. Memory holds only the writes in flight (the
partition's overlay: deferred, or produced and not yet in the database) and a bounded
cache of records read or written lately. So what a worker holds grows with what it has in
flight, not with what it retains; opening a partition reads nothing, its recovery pass
reads the records due, and a sweeper pass reads what is due, not what is retained.

Which partition a write goes to: the one named by ``in_partition(p)`` around the work (the
runner wraps each inbound record; the recovery pass and the engine's sweeper visits wrap
each record through ``near``), else the partition that holds the key already. A new key
with neither is refused: nothing is written to a partition nobody chose.

**Journal before acting.** ``commit`` checks its operations against the latest versions
(the compare-and-set: this worker is the partition's only writer), puts them in the
partition's overlay, produces the changelog records that hold them and returns only when
the broker acked every one of them (the producer runs with acks=all) and, under
``exactly_once``, when the partition's Kafka transaction holding them committed
(``ChangelogPort.commit_soon``:
before that a read_committed restore does not see them; one transaction commit serves
every journal commit whose records it holds, and the commits that arrive meanwhile share
the next one). Concurrent commits (the chats of a batch) share the producer's batches:
their records go out in the same produce requests, so they wait on one round trip together
(group commit). When an ack does not come (the broker is down, the timeout passes) the
commit raises ``JournalUnavailableError`` and its operations are undone in the overlay
where nothing overwrote them since; the caller does not act on it (the provider is not
called, the inbound is not acked).

**Fewer writes.** The writes no side effect waits for (``DEFERRED``: an inbound done, a
send sent, and a fresh inbound journaled; ``botmesh.streams.write_behind``) return at
once and go to the changelog later, each key's latest version once: with the chat's next
awaited write, before it, or with ``flush``, which the worker awaits before it acks a
batch. So a turn's writes that follow its send
share one produce request and one acknowledgement. Receipts marked published are awaited.
Whatever the order of the writes of a key, its last record in the changelog is its latest
version: a value is read when it is handed to the producer, under its partition's lock, so
a flush the producer holds up (a full batch buffer, a transaction's lock) cannot land an
older version after a later write of the key (a restart would restore the older one).

**Fenced by the group.** Under ``at_least_once`` nothing on the broker stops a worker that
lost its partitions from producing to their changelog (under ``exactly_once`` the
transactional producer's epoch does). A worker that was frozen (``SIGSTOP``, a long GC, a
stalled VM) past the session timeout has been evicted and its partitions given to another,
but it does not know yet when it thaws. So ``commit`` asks the port first
(``ChangelogPort.unconfirmed``): when this worker's group membership was last confirmed (a
heartbeat the coordinator accepted, or an assignment) longer ago than half the session
timeout, the write is refused (``JournalUnavailableError``, counted in ``unconfirmed``) until
the coordinator answers again; by then a worker that was evicted has been told, and has
handed its partitions over. The coordinator evicts a member only a whole session timeout
after its last accepted heartbeat, so a write that passed the check leaves at least half
the session timeout before another owner can take the partition. It asks again once an
awaited write is acked, as of when the ack came: a worker frozen between the check and the
send (the record still in its producer's buffer) may reach the log after another owner
restored the partition, so a write acked that late is not acted on
(``MembershipUnconfirmed`` though it is durable: a send it claimed stays in flight, for the
ambiguity policy). A worker that comes back into the group after missing a rebalance has
lost its partitions (its consumer is told, and ``revoke`` drops them); those it is given
again are restored from the changelog first: another owner may have written them.

Only an acked record reaches RocksDB (under ``exactly_once``: only a committed one): the
records acked in one turn of the event loop (a committed transaction's records) are
written into the partition's database in one atomic batch with their index entries and the
changelog offset as persisted, in the order of the acks (then ``persisted`` drops them
from the overlay), so a worker restarted on the same data dir restores only what was
produced after its last acked write, and a deleted data dir is rebuilt from the changelog
whole (the restore writes the index entries too).

Changelog records: key = the journal key (UTF-8), value = ``{"v": version, "d": due,
"p": purge, "r": value}`` as JSON, a tombstone for a delete (``decode_entry`` reads one);
except for the keys stored together (``group``: ``botmesh.state.keys.record_group``, an
inbound with the first sends of its turn and their message log entries): one record,
keyed by the group's key, holds every member the group has (``journal_db.encode_group``;
``journal_db.JournalView`` reads them). So a turn that replies writes the inbound journaled
(before its handlers run), the send's claim (before the provider call; the group's record
then holds the inbound too), after it the inbound done with the send sent and its log
entry, and the receipt's published mark (in that record when the receipt's ack came
first): three or four records. The chat turns are not written to the changelog at all
(``volatile``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import heapq
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar

from botmesh.state.errors import FencedError, JournalUnavailableError, VersionConflictError
from botmesh.state.kv import Entry, IndexName, Op, apply_ops, copy_entry
from botmesh.streams.journal_db import JournalDb, decode_entry, encode_entry, encode_group
from botmesh.streams.write_behind import (
    DEFER_MAX_BYTES,
    DEFERRED,
    DEFERRED_WHEN_FRESH,
    LAZY_COMMIT_S,
    Deferred,
    Flusher,
)
from botmesh.topics.catalog import Catalog

__all__ = [
    "CURRENT_PARTITION",
    "FRESH",
    "ChangelogPort",
    "JournalFence",
    "MembershipUnconfirmed",
    "PartitionRevoked",
    "ProducerFencedOut",
    "TableKv",
    "changelog_topic",
    "decode_entry",
    "encode_entry",
    "in_partition",
]

log = logging.getLogger("botmesh.journal")

#: The partition the work in progress belongs to (the inbound record's, the swept record's).
CURRENT_PARTITION: ContextVar[int | None] = ContextVar("botmesh_partition", default=None)
#: The chat the work in progress is for, when one is (the runner's work on a chat's record):
#: its deferred writes need to go out before its next awaited one, nobody else's do.
CURRENT_CHAT: ContextVar[str | None] = ContextVar("botmesh_chat", default=None)
#: The work in progress is for a fresh inbound record (``DEFERRED_WHEN_FRESH``): one that
#: reached its partition after this worker was given the partition.
FRESH: ContextVar[bool] = ContextVar("botmesh_fresh", default=False)

#: The journal table's name: its changelog is ``<prefix>.worker-journal-changelog``.
TABLE_NAME = "journal"


def changelog_topic(catalog: Catalog) -> str:
    """The journal's changelog topic for a topic catalog."""
    return catalog.changelog(TABLE_NAME)


@contextlib.contextmanager
def in_partition(
    partition: int | None, chat: str | None = None, *, fresh: bool = False
) -> Iterator[None]:
    """Run the body with ``partition`` as the partition of new journal records, for
    ``chat`` (``None``: no chat, or several; see ``DEFERRED``), on a ``fresh`` inbound
    record or not (``DEFERRED_WHEN_FRESH``)."""
    token = CURRENT_PARTITION.set(partition)
    chat_token = CURRENT_CHAT.set(chat)
    fresh_token = FRESH.set(fresh)
    try:
        yield
    finally:
        FRESH.reset(fresh_token)
        CURRENT_CHAT.reset(chat_token)
        CURRENT_PARTITION.reset(token)


class JournalFence(FencedError):
    """A fence of the journal on Kafka: a ``FencedError``, so never retried (this worker is
    a zombie for the record: whoever holds its partition now finishes it), named by what
    fenced it, with its own message. The runner gives the batch up at once and the worker
    starts afresh."""

    def __init__(self, detail: str, key: str = "") -> None:
        super().__init__(key, 0, None)
        self.detail = detail
        self.args = (detail, key)  # as it is made again (a copy, a pickle)

    def __str__(self) -> str:
        return self.detail


class ProducerFencedOut(JournalFence):
    """Under ``exactly_once``: a write whose transaction a newer producer with the same
    transactional id fenced, so another worker owns the partition now (this one was
    evicted, or is being handed the partition away). Never retried here: the runner gives
    the batch up and the worker starts afresh (its producer cannot write again)."""


class PartitionRevoked(JournalFence):
    """A write to a partition another worker owns now (this one was evicted): a fence, not
    an outage. Never retried, never run unjournaled (not even ``fail_open``); the runner
    gives the batch up, and the partition's new owner reads the record again from the
    committed offset."""


class MembershipUnconfirmed(JournalUnavailableError):
    """A write refused because this worker's group membership was not confirmed recently
    enough (``ChangelogPort.unconfirmed``): wait for the group, it is not the journal's
    fault (the runner does not charge it to the record's retry budget)."""


class ChangelogPort(Protocol):
    """What the journal needs from the worker's producer
    (``botmesh.streams.worker.changelog.RdChangelog``)."""

    async def produce(self, partition: int, key: bytes, value: bytes | None) -> Awaitable[Any]:
        """Hand one changelog record to the producer; the awaitable resolves when the record
        is durable: on its ack (at_least_once), once its transaction committed
        (exactly_once); it raises when the record is lost (not acked, aborted)."""
        ...

    def database(self, partition: int) -> JournalDb:
        """The partition's local RocksDB database (restored from the changelog). The port
        writes each acked record there (``JournalDb.write``) and then tells the journal
        (``TableKv.persisted``)."""
        ...

    #: The records go into Kafka transactions (``exactly_once``): what ``produce`` returns
    #: resolves once the record's transaction committed, which ``commit_soon`` asks for.
    transactional: bool

    def commit_soon(self, partitions: Sequence[int], delay: float = 0.0) -> None:
        """Commit the open transaction of each partition soon (one commit for every record
        produced before it starts; later records wait for the next one); with ``delay``,
        that many seconds later (once: a partition already waiting does not wait again)."""
        ...

    def unconfirmed(self, *, acked: bool = False) -> str | None:
        """Why this worker may no longer be the group member that owns its partitions (its
        membership was last confirmed too long ago: it was frozen, or the coordinator is
        out of reach), else ``None``. With ``acked``: as of when the acks just awaited
        came (a record produced before a freeze may reach the broker after the thaw)."""
        ...


#: Called for each newly loaded partition (inside ``in_partition``): the recovery pass.
OnAssigned = Callable[[int], Awaitable[object]]

#: Called when a transaction holding deferred writes (``DEFERRED``) could not be
#: committed: memory holds what the changelog lost (the worker exits:
#: ``botmesh.streams.worker.loop``).
OnLost = Callable[[int, BaseException], None]

#: Bytes of the members' values a group record holds at most (``TableKv._records``): a
#: member that does not fit is stored alone, so a group record stays well under the
#: producer's limit on a record (``message.max.bytes``, 1,000,000).
GROUP_BYTES = 256 * 1024


def _remembered(
    what: Callable[[str], _T] | None,
) -> Callable[[str], _T] | None:
    """``what`` with its answers for the keys asked lately kept (a key is asked about at
    each of its writes, at each record that holds it and when that record is acked)."""
    return None if what is None else functools.lru_cache(maxsize=KEYS_REMEMBERED)(what)


class _Part:
    """A partition this worker owns: its database, and what memory holds over it."""

    __slots__ = (
        "db",
        "deferred",
        "grouped",
        "lists",
        "overlay",
        "pending",
        "producing",
        "records",
        "riders",
    )

    def __init__(self, db: JournalDb) -> None:
        self.db = db
        #: Held while records of the partition are handed to the producer: each is read
        #: from ``overlay`` in that turn, so a key's last record in the changelog is always
        #: its latest write (``TableKv._produce_and_wait``).
        self.producing = asyncio.Lock()
        #: The records written here and not yet in the database (deferred, produced and not
        #: acked, or not persisted yet), ``None`` for a delete: they hide the database's.
        self.overlay: dict[str, Entry | None] = {}
        #: How many of each key's produced writes are not in the database yet.
        self.pending: dict[str, int] = {}
        #: The keys whose latest write (in ``overlay``) is not produced yet (``DEFERRED``),
        #: with the chat whose work wrote it (``None``: no chat, or more than one).
        self.deferred = Deferred()
        #: The keys of ``overlay`` stored in a group record, by group (``record_group``).
        self.grouped: dict[str, set[str]] = {}
        #: The members each group's last record produced here held (the latest ones first:
        #: up to ``KEYS_REMEMBERED``); a group not here is read from the database.
        self.lists: dict[str, tuple[str, ...]] = {}
        #: Each changelog record produced and not persisted yet, by its key, in the order
        #: produced: the keys whose pending write it holds (``persisted`` counts them down).
        self.records: dict[str, collections.deque[tuple[str, ...]]] = {}
        #: What rides with each key's next changelog record (``TableKv.ride``).
        self.riders: dict[str, list[Rider]] = {}


#: What ``_produce_and_wait`` produces: per partition, the keys whose latest version goes.
_Produce = list[tuple[int, list[str]]]
#: What a commit changed in one partition: the partition, its records before and after.
_Change = tuple[int, dict[str, Entry | None], dict[str, Entry | None]]

#: A record of another topic that rides with a journal write (``TableKv.ride``): hands it to
#: the producer, and returns its ack (which nobody waits for: its transaction's failure
#: fails the journal's write too).
Rider = Callable[[], Awaitable[Awaitable[object]]]


_MISSING: Any = object()
_T = TypeVar("_T")
#: Keys whose ``volatile`` and ``group`` answers are kept (``_remembered``).
KEYS_REMEMBERED = 8192
#: Encoded values kept (``TableKv._encoded``), and the largest one kept: at most 16 MiB.
ENCODINGS_KEPT = 1024
ENCODING_KEPT_BYTES = 16 * 1024


class TableKv:
    """The ``DurableKv`` of the Kafka worker (see the module docstring)."""

    def __init__(
        self,
        port: ChangelogPort,
        *,
        ack_timeout: float = 30.0,
        cache_size: int = 10_000,
        volatile: Callable[[str], bool] | None = None,
        group: Callable[[str], str | None] | None = None,
    ) -> None:
        self._port = port
        #: The key of the changelog record that holds a key's, when it is stored with others
        #: (``botmesh.state.keys.record_group``: an inbound with what its turn wrote); else
        #: each key has a record of its own.
        self._group = _remembered(group)
        #: Keys whose records live in memory only, while this worker owns their partition
        #: (never produced, never in RocksDB): the chat turns (``botmesh.state.keys.
        #: is_turn_key``). A turn says which inbound of the chat runs now, and only its
        #: partition's owner runs them; a turn found in the journal by a later owner (or a
        #: later boot) is an orphan it reclaims at once (``Partitioned``), so a durable
        #: record of one would tell nobody anything.
        self._volatile = _remembered(volatile)
        self.ack_timeout = ack_timeout
        self._parts: dict[int, _Part] = {}
        #: Records read or written lately (an LRU): key -> (partition, entry). Only keys
        #: with no write in flight (those are in their partition's overlay).
        self._cache: dict[str, tuple[int, Entry]] = {}
        #: The changelog values of entries encoded lately (``_encoded``), by key.
        self._encodings: dict[str, tuple[Entry, bytes]] = {}
        self.cache_size = cache_size
        self._closed = False
        #: Partitions being handed over: no new write, their writes in flight still land.
        self._closing: set[int] = set()
        #: Partitions whose acked records could not all be written to RocksDB: nothing more
        #: is recorded as persisted for them until they are restored again.
        self.broken: set[int] = set()
        self._inflight: dict[int, set[asyncio.Future[Any]]] = {}
        #: Flushes the deferred writes ``FLUSH_AFTER_S`` after the first, one flush at a time.
        self.write_behind = Flusher(self.flush, lambda: bool(self.deferred) and not self._closed)
        self.on_assigned: OnAssigned | None = None
        #: Called before partitions are handed over (the worker records its receipts).
        self.on_revoking: Callable[[], Awaitable[object]] | None = None
        self.on_lost: OnLost | None = None
        #: Given the seconds each awaited write took to be acked (the worker's histogram).
        self.write_seconds: Callable[[float], None] | None = None
        #: Partitions opened whose ``on_assigned`` (the recovery pass) has not ended yet.
        self.recovering: set[int] = set()
        #: Changelog records acked, and commits that failed for want of an ack.
        self.acked = 0
        self.failed = 0
        #: Commits refused because the worker's group membership was not confirmed recently
        #: enough (``ChangelogPort.unconfirmed``).
        self.unconfirmed = 0

    # -- partitions -----------------------------------------------------------------------

    @property
    def owned(self) -> frozenset[int]:
        """The partitions open here (owned by this worker)."""
        return frozenset(self._parts)

    def owns(self, partition: int) -> bool:
        """The partition is this worker's to write (open, not being handed over)."""
        return partition in self._parts and partition not in self._closing

    def loaded(self, partition: int) -> bool:
        """The partition is open and its acked writes go to RocksDB."""
        return partition in self._parts and partition not in self.broken

    @property
    def in_memory(self) -> int:
        """Records memory holds: those in flight, and the cache."""
        return len(self._cache) + sum(len(part.overlay) for part in self._parts.values())

    async def assign(self, partitions: Iterable[int]) -> list[int]:
        """Open the partitions not open yet on their (restored) databases, then run
        ``on_assigned`` for each, inside ``in_partition``; returns the new ones. Nothing is
        read here: the recovery pass reads what is due."""
        new = sorted(p for p in set(partitions) if p not in self._parts)
        for p in new:
            self.broken.discard(p)
            self._parts[p] = _Part(self._port.database(p))
            log.info("journal partition %d opened", p)
        if self.on_assigned is not None:
            self.recovering.update(new)
            for p in new:
                if p not in self._parts:  # revoked again meanwhile
                    self.recovering.discard(p)
                    continue
                with in_partition(p):
                    try:
                        await self.on_assigned(p)
                    except Exception:
                        log.exception(
                            "recovery of journal partition %d failed; the sweeper tries again", p
                        )
                    finally:
                        self.recovering.discard(p)
        return new

    async def hand_over(self, partitions: Iterable[int]) -> None:
        """Give partitions up cleanly: ``on_revoking`` (while they are still ours), then no
        new write to them, then wait (up to ``ack_timeout``) for their writes in flight to
        be acked and written to RocksDB, then ``revoke``. A partition given back later is
        opened on RocksDB again, which then holds every write this worker made to it."""
        gone = [p for p in set(partitions) if p in self._parts]
        if not gone:
            return
        if self.on_revoking is not None:
            try:
                async with asyncio.timeout(self.ack_timeout):
                    await self.on_revoking()
            except Exception as exc:
                log.warning("before handing partitions %s over: %s", gone, exc)
        try:  # their deferred writes too
            await self.flush(gone)
        except Exception as exc:
            log.warning("before handing partitions %s over, deferred writes: %s", gone, exc)
        self._closing.update(gone)
        try:
            flying = [f for p in gone for f in self._inflight.get(p, ())]
            if flying:
                await asyncio.wait(flying, timeout=self.ack_timeout)
        finally:
            self.revoke(gone)

    def revoke(self, partitions: Iterable[int]) -> None:
        """Forget the partitions another worker owns now."""
        for p in partitions:
            self._closing.discard(p)
            self.broken.discard(p)
            part = self._parts.pop(p, None)
            if part is None:
                continue
            stale = [k for k, (q, _) in self._cache.items() if q == p]
            for k in stale:
                del self._cache[k]
            log.info(
                "journal partition %d revoked: %d records in flight dropped (%d deferred)",
                p,
                len(part.overlay),
                len(part.deferred),
            )

    def persisted(self, partition: int, keys: Iterable[bytes]) -> None:
        """The port wrote these records of the partition (in the order produced) into its
        database: a key whose writes are all there now is read from there again."""
        part = self._parts.get(partition)
        if part is None:
            return
        pending = part.pending
        records = part.records
        for raw in keys:
            queued = records.get(raw.decode())
            if not queued:
                continue
            held = queued.popleft()
            if not queued:
                del records[raw.decode()]
            for key in held:
                n = pending.get(key)
                if n is None:
                    continue
                if n > 1:
                    pending[key] = n - 1
                    continue
                del pending[key]
                if key in part.deferred:  # a later version is not produced yet
                    continue
                entry = part.overlay.pop(key, None)
                if self._group is not None and (g := self._group(key)) is not None:
                    members = part.grouped.get(g)
                    if members is not None:
                        members.discard(key)
                        if not members:
                            del part.grouped[g]
                if entry is not None:
                    self._remember(key, partition, entry)

    def _remember(self, key: str, partition: int, entry: Entry) -> None:
        cache = self._cache
        cache.pop(key, None)
        cache[key] = (partition, entry)
        if len(cache) > self.cache_size:
            del cache[next(iter(cache))]

    def _read(self, p: int, part: _Part, key: str) -> Entry | None:
        """The latest version of ``key`` in partition ``p`` (shared: copy before handing
        it out)."""
        held = part.overlay.get(key, _MISSING)
        if held is not _MISSING:
            return held  # type: ignore[no-any-return]
        hit = self._cache.get(key)
        if hit is not None and hit[0] == p:
            return hit[1]
        entry = part.db.get(key)
        if entry is not None:
            self._remember(key, p, entry)
        return entry

    def _locate(self, key: str) -> int | None:
        """The owned partition that holds ``key``, if any."""
        hit = self._cache.get(key)
        if hit is not None and hit[0] in self._parts:
            return hit[0]
        for p, part in self._parts.items():
            if self._read(p, part, key) is not None:
                return p
        return None

    def near(self, key: str) -> contextlib.AbstractContextManager[None]:
        """The partition of ``key`` for the work on it (``botmesh.state.kv.Partitioned``)."""
        current = CURRENT_PARTITION.get()
        if current is not None:
            part = self._parts.get(current)
            if part is not None and self._read(current, part, key) is not None:
                return contextlib.nullcontext()
        p = self._locate(key)
        if p is None or current == p:
            return contextlib.nullcontext()
        return in_partition(p)

    def across_partitions(self) -> contextlib.AbstractContextManager[None]:
        """No current partition for the body: each key is read and written in the partition
        that holds it (``botmesh.state.kv.Partitioned``), even inside one partition's work (the
        recovery pass of a partition records the receipts of every chat published)."""
        return in_partition(None)

    # -- the SPI --------------------------------------------------------------------------

    async def open(self) -> None:
        self._closed = False

    async def close(self) -> None:
        """Flush the deferred writes (a clean stop: the producer still runs), then refuse
        every call."""
        self.write_behind.cancel()
        if not self._closed and self._parts:
            n = self.deferred
            try:
                async with asyncio.timeout(self.ack_timeout):
                    await self.flush(commit=True)
                log.info("journal closed (%d deferred writes flushed)", n)
            except Exception as exc:  # as a crash here would: they are written again
                log.warning("deferred journal writes not flushed at the stop: %s", exc)
        self._closed = True

    def _check(self) -> None:
        if self._closed:
            raise JournalUnavailableError("the worker's journal is closed (the worker stopped)")

    def _lookup(self, key: str) -> Entry | None:
        p = CURRENT_PARTITION.get()
        if p is None:
            p = self._locate(key)
        part = None if p is None else self._parts.get(p)
        return None if p is None or part is None else self._read(p, part, key)

    async def get(self, key: str) -> Entry | None:
        self._check()
        e = self._lookup(key)
        return copy_entry(e) if e is not None else None

    async def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        self._check()
        found: dict[str, Entry] = {}
        for k in keys:
            if (e := self._lookup(k)) is not None:
                found[k] = copy_entry(e)
        return found

    def _route(self, ops: Sequence[Op]) -> dict[int, list[tuple[int, Op]]]:
        """Each op (with its place in ``ops``) by partition: the current one for all when
        one is set, else the partition that holds each key."""
        p = CURRENT_PARTITION.get()
        if p is not None:
            return {p: list(enumerate(ops))}
        groups: dict[int, list[tuple[int, Op]]] = {}
        for i, op in enumerate(ops):
            q = self._locate(op.key)
            if q is None:
                if op.expect:  # a record this worker had: its partition moved
                    raise VersionConflictError(op.key, op.expect, None)
                raise JournalUnavailableError(
                    f"journal write of {op.key!r} has no partition: a new record is written "
                    "while its chat's inbound (or request) record is handled on the worker"
                )
            groups.setdefault(q, []).append((i, op))
        return groups

    async def commit(self, ops: Sequence[Op], *, label: str = "") -> list[int]:
        """All of ``ops`` or none, in memory; the ops of each partition go to that
        partition's changelog (a commit across partitions is not one atomic write there:
        the engine's only such commits, receipts marked published and retention purges,
        are correct op by op)."""
        self._check()
        if not ops:
            return []
        stale = self._port.unconfirmed()
        if stale is not None:  # the group may have given the partitions to another worker
            raise self._stale(label, ops[0].key, "refused", stale)
        groups = self._route(ops)
        versions = [0] * len(ops)
        changes = self._apply(groups, versions)
        chat = CURRENT_CHAT.get()
        deferred = self._defers(label, changes)
        kept = self._overlay(changes, chat, deferred=deferred)
        if deferred or not kept:
            if deferred and kept:
                self.write_behind.soon()
            return versions
        # an awaited write: what this chat's work deferred in its partitions goes first, then
        # its own records (a key deferred and written again here goes once)
        volatile = self._volatile
        taken: list[tuple[int, dict[str, str | None]]] = []
        produce: _Produce = []
        for p, _, after in changes:
            part = self._parts[p]
            first = part.deferred.take(chat)
            own = {k: part.deferred.pop(k) for k in after if k in part.deferred}
            taken.append((p, {**first, **own}))
            mine = [k for k in after if volatile is None or not volatile(k)]
            produce.append((p, [*(k for k in first if k not in after), *mine]))
        try:
            timed = self.write_seconds
            if timed is None:
                await self._produce_and_wait(produce)
            else:
                started = time.perf_counter()
                await self._produce_and_wait(produce)
                timed(time.perf_counter() - started)
        except BaseException as exc:
            self._roll_back(changes, taken)
            error = _write_error(exc, label, ops[0].key)
            if error is None:
                raise
            raise error from exc
        # acked, but maybe after this worker was frozen past its session: the record may
        # have reached the log after another owner restored the partition, which then acts
        # on what it found; so nothing acts on this write here (it is durable: a send it
        # claimed is in flight, resolved by the ambiguity policy, by whoever owns it then)
        stale = self._port.unconfirmed(acked=True)
        if stale is not None:
            raise self._stale(label, ops[0].key, "acked, but not acted on", stale)
        return versions

    def _stale(self, label: str, key: str, what: str, why: str) -> MembershipUnconfirmed:
        """A write refused (or not acted on) while this worker's group membership is
        unconfirmed, counted in ``unconfirmed``."""
        self.unconfirmed += 1
        return MembershipUnconfirmed(
            f"journal write {label or '(unlabelled)'} of {key!r} {what}: {why}"
        )

    def _apply(self, groups: dict[int, list[tuple[int, Op]]], versions: list[int]) -> list[_Change]:
        """Applies each partition's ops to a view of its records (``VersionConflictError``,
        or ``PartitionRevoked`` for a partition this worker does not own, before anything is
        applied), setting each op's new version in ``versions``; each partition's records
        before and after."""
        changes: list[_Change] = []
        for p, items in groups.items():  # every check first: nothing applied on a conflict
            part = self._parts.get(p) if p not in self._closing else None
            if part is None:
                op = items[0][1]
                if op.expect:  # a holder's compare-and-set: the record is not ours now
                    raise VersionConflictError(op.key, op.expect, None)
                raise PartitionRevoked(
                    f"journal partition {p} is not owned by this worker (it was "
                    f"revoked); {op.key!r} not written",
                    op.key,
                )
            part_ops = [op for _, op in items]
            keys = list(dict.fromkeys(op.key for op in part_ops))
            view = {k: e for k in keys if (e := self._read(p, part, k)) is not None}
            before = {k: view.get(k) for k in keys}
            for (i, _), v in zip(items, apply_ops(view, part_ops), strict=True):
                versions[i] = v
            changes.append((p, before, {k: view.get(k) for k in keys}))
        return changes

    def _defers(self, label: str, changes: list[_Change]) -> bool:
        """Whether a commit labelled ``label`` is written behind (``DEFERRED``, or
        ``DEFERRED_WHEN_FRESH`` on a fresh record) rather than awaited: never when one of
        its records is over ``DEFER_MAX_BYTES``."""
        return (label in DEFERRED or (label in DEFERRED_WHEN_FRESH and FRESH.get())) and not any(
            e is not None and len(self._encoded(e)) > DEFER_MAX_BYTES
            for _, _, after in changes
            for e in after.values()
        )

    def _overlay(self, changes: list[_Change], chat: str | None, *, deferred: bool) -> int:
        """Puts the committed records in memory (each partition's overlay), noting the
        deferred ones for the chat's next write; how many go to the changelog (the
        volatile ones do not)."""
        volatile = self._volatile
        kept = 0
        for p, _, after in changes:
            part = self._parts[p]
            for key, entry in after.items():
                part.overlay[key] = entry
                self._cache.pop(key, None)
                if volatile is not None and volatile(key):
                    continue
                if self._group is not None and (g := self._group(key)) is not None:
                    part.grouped.setdefault(g, set()).add(key)
                kept += 1
                if deferred:
                    part.deferred.add(key, chat)
        return kept

    def ride(self, key: str, rider: Rider) -> Callable[[], None]:
        """Hand ``rider`` to the producer right after the next changelog record that holds
        ``key``'s write (of the current partition), in the same turn of the event loop: so,
        under ``exactly_once``, in the same transaction (a receipt commits with the settled
        record it reports, or neither does). Call it before the write; what it returns
        takes the rider back (the write was not made). A partition revoked first drops it
        (its new owner settles the record, and reports it, again)."""
        p = CURRENT_PARTITION.get()
        if p is None:
            p = self._locate(key)
        part = self._parts.get(p) if p is not None and p not in self._closing else None
        if part is None:
            raise PartitionRevoked(
                f"{key!r}: no journal partition of this worker to ride with", key
            )
        # by the record that will hold the write: its group's, else its own
        slot = (self._group(key) if self._group is not None else None) or key
        part.riders.setdefault(slot, []).append(rider)

        def back() -> None:
            riders = part.riders.get(slot)
            if riders is not None and rider in riders:
                riders.remove(rider)
                if not riders:
                    del part.riders[slot]

        return back

    async def _ride_along(self, part: _Part, record: str) -> None:
        for rider in part.riders.pop(record, ()):
            try:
                ack = await rider()
            except Exception:  # a record the producer refused: said, the journal goes on
                log.exception("a record riding with journal record %r was not produced", record)
                continue
            if isinstance(ack, asyncio.Future):
                ack.add_done_callback(_quiet)

    def _roll_back(
        self, changes: list[_Change], taken: list[tuple[int, dict[str, str | None]]]
    ) -> None:
        """After a failed write: the records it replaced put back in memory and the deferred
        writes it took given back (for the next write), counted in ``failed``."""
        for p, before, after in reversed(changes):
            self._undo(p, before, after)
        self._give_back(taken)
        self.failed += 1

    def _give_back(self, taken: list[tuple[int, dict[str, str | None]]]) -> None:
        for p, keys in taken:
            part = self._parts.get(p)
            if part is not None and p not in self._closing:
                part.deferred.give_back(keys, part.overlay)

    # -- deferred writes ------------------------------------------------------------------

    @property
    def deferred(self) -> int:
        """Deferred writes not produced yet (``DEFERRED``)."""
        return sum(len(part.deferred) for part in self._parts.values())

    async def flush(self, partitions: Iterable[int] | None = None, *, commit: bool = False) -> None:
        """Produce every deferred write (of ``partitions``, else of every partition) and
        return once it is durable, with every write produced before: acked
        (``at_least_once``); under ``exactly_once``, in the worker's open transaction,
        which the next checkpoint commits with the batch's offsets (or
        ``LAZY_COMMIT_S`` later; at once and awaited with ``commit``). Raises
        ``JournalUnavailableError`` when that fails; the writes stay deferred, for the next
        flush."""
        self._check()
        wanted = set(self._parts) if partitions is None else set(partitions)
        taken = [
            (p, part.deferred.take(None))
            for p, part in self._parts.items()
            if p in wanted and part.deferred and p not in self._closing
        ]
        waits = commit or not self._port.transactional
        # what was produced before (another flush's records, a barrier's) lands first
        earlier = [f for p in wanted for f in self._inflight.get(p, ())] if waits else []
        try:
            if taken:
                stale = self._port.unconfirmed()
                if stale is not None:
                    self.unconfirmed += 1
                    raise MembershipUnconfirmed(f"deferred journal writes not produced: {stale}")
                await self._produce_and_wait([(p, list(keys)) for p, keys in taken], wait=waits)
            if earlier:
                async with asyncio.timeout(self.ack_timeout):
                    await asyncio.wait(earlier)
        except BaseException as exc:
            self._give_back(taken)
            self.failed += 1
            if isinstance(exc, FencedError) and not isinstance(exc, JournalFence):
                raise ProducerFencedOut(
                    f"deferred journal writes refused: a newer producer owns the "
                    f"partitions' transactions ({exc})"
                ) from exc
            if isinstance(exc, Exception) and not isinstance(exc, JournalUnavailableError):
                raise JournalUnavailableError(
                    f"deferred journal writes not acked by the broker: {type(exc).__name__}: {exc}"
                ) from exc
            raise
        lost = [f for f in earlier if f.cancelled() or f.exception() is not None]
        if lost:  # another flush's (its records are deferred again) or a barrier's
            raise JournalUnavailableError(
                f"{len(lost)} journal writes produced before this flush were not acked; "
                "what they held is deferred again"
            )

    def _ask_again(self, p: int) -> None:
        """The membership asked again once partition ``p``'s producing is this write's: a
        write that waited for it (another chat's records being handed over) may have waited
        over a freeze, past the check its commit made."""
        stale = self._port.unconfirmed()
        if stale is not None:
            self.unconfirmed += 1
            raise MembershipUnconfirmed(f"journal records of partition {p} not produced: {stale}")

    async def _produce_and_wait(self, produce: _Produce, *, wait: bool = True) -> None:
        """Produce the latest version of each key, and wait for the acks (``wait``); under
        ``exactly_once``, without ``wait``: committed with the partition's next
        transaction, and a failure calls ``on_lost``."""
        # every record counted pending before the first await: an ack of an earlier version
        # that lands meanwhile must not drop the latest from the overlay (``persisted``)
        todo: list[tuple[int, _Part, list[str]]] = []
        for p, keys in produce:
            part = self._parts[p]
            for key in keys:
                part.pending[key] = part.pending.get(key, 0) + 1
            todo.append((p, part, keys))
        acks: list[tuple[int, Awaitable[Any]]] = []
        for n, (p, part, keys) in enumerate(todo):
            # each value read as it is handed over, under the partition's lock: a value read
            # before an await could reach the changelog after a later write of its key (a
            # flush's ``sent`` after the receipt's published mark), and a restart would
            # restore the older one
            handed = 0
            records: list[tuple[str, bytes | None, tuple[str, ...]]] = []
            try:
                async with part.producing:
                    self._ask_again(p)
                    records = self._records(p, part, keys)
                    for key, value, held in records:
                        ack = await self._port.produce(p, key.encode(), value)
                        handed += 1
                        part.records.setdefault(key, collections.deque()).append(held)
                        if part.riders:
                            await self._ride_along(part, key)
                        if isinstance(ack, asyncio.Future):
                            flying = self._inflight.setdefault(p, set())
                            flying.add(ack)
                            ack.add_done_callback(flying.discard)
                        acks.append((p, ack))
            except BaseException:  # a failed or cancelled hand-over: the rest never went
                rest = (
                    [(p, k) for _, _, held in records[handed:] for k in held]
                    if records
                    else [(p, k) for k in keys]
                )
                self._unproduced(rest + [(q, k) for q, _, ks in todo[n + 1 :] for k in ks])
                raise
        if not acks:
            return
        partitions = list(dict.fromkeys(p for p, _ in acks))
        if self._port.transactional:  # exactly_once: each one resolves at its commit
            if not wait:
                for p, ack in acks:
                    asyncio.ensure_future(ack).add_done_callback(functools.partial(self._lost, p))
                self._port.commit_soon(partitions, LAZY_COMMIT_S)
                return
            self._port.commit_soon(partitions)
        async with asyncio.timeout(self.ack_timeout):  # no task per wait (wait_for makes one)
            if len(acks) == 1:
                await acks[0][1]
            else:
                await asyncio.gather(*(ack for _, ack in acks))
        self.acked += len(acks)

    def _records(
        self, p: int, part: _Part, keys: list[str]
    ) -> list[tuple[str, bytes | None, tuple[str, ...]]]:
        """The changelog records that write the latest version of ``keys``: (its key, its
        value, the keys of ``keys`` it holds). A key stored alone has a record of its own; a
        key of a group (``record_group``) goes in its group's record, which holds every
        member the group has (the database's and memory's, latest versions), a tombstone of
        the group's key when none is left; a member deleted also gets a tombstone of its own
        key (for a record of it stored alone, or from before groups), and a member whose
        value does not fit in ``GROUP_BYTES`` is listed and stored alone, after it."""
        group_of = self._group
        out: list[tuple[str, bytes | None, tuple[str, ...]]] = []
        groups: dict[str, list[str]] = {}
        for key in keys:
            g = group_of(key) if group_of is not None else None
            if g is None:
                entry = part.overlay[key]
                out.append((key, self._encoded(entry) if entry is not None else None, (key,)))
            else:
                groups.setdefault(g, []).append(key)
        lists = part.lists
        for g, asked in groups.items():
            listed = lists.pop(g, None)
            names = dict.fromkeys(part.db.members(g) if listed is None else listed)
            names.update(dict.fromkeys(part.grouped.get(g, ())))
            names.update(dict.fromkeys(asked))
            members: list[tuple[str, bytes | None]] = []
            alone: list[tuple[str, bytes | None, tuple[str, ...]]] = []
            apart: set[str] = set()  # stored alone: their own record holds their write
            room = GROUP_BYTES
            for m in names:
                entry = self._read(p, part, m)
                if entry is None:
                    if m in asked and m != g:  # deleted: its own key's record too
                        alone.append((m, None, ()))
                    continue
                value = self._encoded(entry)
                if len(value) <= room:
                    members.append((m, value))
                    room -= len(value)
                else:  # too large to share the record: stored alone, listed
                    members.append((m, None))
                    alone.append((m, value, (m,) if m in asked else ()))
                    apart.add(m)
            shared = tuple(m for m in asked if m not in apart)
            out.append((g, encode_group(members) if members else None, shared))
            if members:
                lists[g] = tuple(m for m, _ in members)
                if len(lists) > KEYS_REMEMBERED:
                    del lists[next(iter(lists))]
            out.extend(alone)
        return out

    def _encoded(self, entry: Entry) -> bytes:
        """``encode_entry(entry)``, kept for the entries encoded lately (a group's record
        holds its members again each time one of them is written)."""
        cache = self._encodings
        hit = cache.get(entry.key)
        if hit is not None and hit[0] is entry:
            return hit[1]
        value = encode_entry(entry)
        if len(value) <= ENCODING_KEPT_BYTES:
            cache[entry.key] = (entry, value)
            if len(cache) > ENCODINGS_KEPT:
                del cache[next(iter(cache))]
        return value

    def _unproduced(self, records: list[tuple[int, str]]) -> None:
        """Records (partition, key) counted pending that were never handed to the producer."""
        for p, key in records:
            part = self._parts.get(p)
            n = None if part is None else part.pending.get(key)
            if part is None or n is None:
                continue
            if n > 1:
                part.pending[key] = n - 1
            else:
                del part.pending[key]

    def _lost(self, p: int, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled() or fut.exception() is None:
            return
        exc = fut.exception()
        assert exc is not None
        self.failed += 1
        if not self.owns(p):
            # revoked or being handed over (the new owner fenced the transaction): memory
            # drops the partition, so nothing here holds what the changelog lost
            log.info("journal partition %d: writes lost with its transaction at hand-over", p)
        elif self.on_lost is not None:
            self.on_lost(p, exc)

    def _undo(
        self, p: int, before: dict[str, Entry | None], after: dict[str, Entry | None]
    ) -> None:
        """Put back what a failed commit replaced, where nothing overwrote it since. Its
        write stays counted as pending: the key is read from memory until the partition is
        opened again (the database may lack it, or hold it if the ack came late)."""
        part = self._parts.get(p)
        if part is None:
            return
        for key, old in before.items():
            if part.overlay.get(key, _MISSING) is after[key]:
                part.overlay[key] = old

    async def range(
        self, index: IndexName, prefix: str, until: float, limit: int = 100
    ) -> list[str]:
        self._check()
        p = CURRENT_PARTITION.get()
        if p is not None:
            part = self._parts.get(p)
            parts = [] if part is None else [part]
        else:
            parts = list(self._parts.values())
        per = [_ranged(part, index, prefix, until, limit) for part in parts]
        return [key for _, key in heapq.merge(*per)][: max(limit, 0)]

    async def scan(self, prefix: str) -> list[Entry]:
        self._check()
        p = CURRENT_PARTITION.get()
        if p is not None:
            part = self._parts.get(p)
            parts = [] if part is None else [part]
        else:
            parts = list(self._parts.values())
        found: list[Entry] = []
        for part in parts:
            found.extend(part.db.scan(prefix, part.overlay))
            found.extend(
                copy_entry(e)
                for k, e in part.overlay.items()
                if e is not None and k.startswith(prefix)
            )
        found.sort(key=lambda e: e.key)
        return found


def _ranged(
    part: _Part, index: IndexName, prefix: str, until: float, limit: int
) -> list[tuple[float, str]]:
    """A partition's keys due by ``until`` in ``index``: the database's, where memory holds
    no newer version, merged with memory's."""
    if limit <= 0:
        return []
    disk = part.db.range(index, prefix, until, limit, part.overlay)
    mem = sorted(
        (score, k)
        for k, e in part.overlay.items()
        if e is not None
        and (score := getattr(e, index)) is not None
        and score <= until
        and k.startswith(prefix)
    )
    if not mem:
        return disk
    return list(heapq.merge(disk, mem))[:limit]


def _write_error(exc: BaseException, label: str, key: str) -> Exception | None:
    """What a commit raises when its changelog write failed with ``exc``: the producer's
    fence (``botmesh.streams.worker.changelog``: a ``FencedError``) as ``ProducerFencedOut``,
    any other error that is not the journal's own as ``JournalUnavailableError``; ``None``
    for ``exc`` itself (a journal error, a fence, a cancellation)."""
    if isinstance(exc, FencedError) and not isinstance(exc, JournalFence):
        return ProducerFencedOut(
            f"journal write {label or '(unlabelled)'} of {key!r} refused: a "
            f"newer producer owns its partition's transactions ({exc})",
            key,
        )
    if isinstance(exc, Exception) and not isinstance(exc, JournalUnavailableError | FencedError):
        return JournalUnavailableError(
            f"journal write {label or '(unlabelled)'} of {key!r} not acked by "
            f"the broker: {type(exc).__name__}: {exc}"
        )
    return None


def _quiet(ack: asyncio.Future[object]) -> None:
    """A rider's ack: its failure is the journal write's (the same transaction), said there."""
    if not ack.cancelled():
        ack.exception()
