"""The Faust table under the worker's journal: ``JournalTable``.

Faust restores its RocksDB partitions from the changelog and keeps standbys; the journal
(``botmesh.streams.table_kv.TableKv``) writes the changelog itself through the table's
``produce`` and is told when partitions come and go. Under ``exactly_once`` each journal
partition's records go into that partition's Kafka transaction, committed here
(``commit_soon``). The workarounds of Faust's restore it relies on are in
``botmesh.streams.faust_app.defects``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import faust
from aiokafka.errors import ProducerFenced
from aiokafka.producer.transaction_manager import TransactionState
from faust.types import TP

from botmesh.state.errors import JournalUnavailableError
from botmesh.streams.faust_app.defects import bootstrap_of, read_committed, read_committed_into
from botmesh.streams.journal_db import JournalDb
from botmesh.streams.table_kv import ProducerFencedOut, TableKv

__all__ = ["JOURNAL_ROCKSDB", "JournalTable"]

log = logging.getLogger("botmesh.streams")


#: RocksDB settings of each journal partition's database. Faust's defaults (memtables of
#: 64 MiB, three of them, and a 2 GiB block cache, per partition) let a worker's memory grow
#: by hundreds of MiB with a restore or a scan; the journal reads little and writes small
#: batches, so each partition gets at most 2 x 16 MiB of memtables and a 32 MiB cache.
JOURNAL_ROCKSDB: Mapping[str, int] = {
    "write_buffer_size": 16 * 2**20,
    "max_write_buffer_number": 2,
    "block_cache_size": 32 * 2**20,
}


class JournalTable(faust.Table):  # type: ignore[type-arg]
    """The Faust table under the worker's journal (``botmesh.streams.table_kv.TableKv``): Faust
    restores its RocksDB partitions from the changelog; the journal writes the changelog
    itself (through ``produce``) and is told when partitions come and go."""

    botmesh_kv: TableKv | None = None
    #: The longest a journal write may follow the last confirmation of this worker's group
    #: membership (half the session timeout; ``build_app`` sets it).
    membership_limit = 15.0
    #: ``time.monotonic()`` of the last confirmation: the start of a heartbeat the group
    #: coordinator accepted (in the consumer's thread), or an assignment.
    _confirmed = 0.0
    _watched: Any = None
    #: The group generation of the last assignment (``None`` before the first).
    _generation: int | None = None
    #: Records acked in this turn of the loop, by partition, waiting for ``_persist_acked``.
    _acked_records: dict[int, list[tuple[bytes, bytes | None, int]]]
    #: Who writes (the runtime's instance id; ``build_app`` sets it) and the group generation
    #: it got its partitions in: header ``botmesh.writer`` = ``<instance id>@<generation>``
    #: on every changelog record, so an operator (and the tests) can tell who wrote what.
    writer_id = ""
    _writer: list[tuple[str, bytes]] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._acked_records = {}

    async def on_rebalance(
        self, assigned: set[TP], revoked: set[TP], newly_assigned: set[TP], generation_id: int = 0
    ) -> None:
        kv = self.botmesh_kv
        last, self._generation = self._generation, generation_id
        if kv is not None and kv.owned and last is not None and generation_id > last + 1:
            # Generations passed without this worker (it was evicted: frozen, cut off), so
            # its partitions may have had another owner meanwhile, whose writes its memory
            # lacks; Faust sees the same partitions assigned again and restores nothing
            # new into memory. Drop them without writing anything from the stale state:
            # ``on_recovery_completed`` reloads them from RocksDB, which Faust's recovery
            # brings up to the changelog's end first.
            log.warning(
                "group generation %d follows %d: this worker missed a rebalance (evicted), "
                "its journal partitions %s are reloaded from the changelog",
                generation_id,
                last,
                sorted(kv.owned),
            )
            kv.revoke(kv.owned)
        self._confirmed = time.monotonic()
        self._watch_heartbeats()
        self._writer = [("botmesh.writer", f"{self.writer_id}@{generation_id}".encode())]
        if kv is not None:  # before Faust touches the databases: no write of ours lands late
            topic = self.changelog_topic_name
            actives = {
                tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == topic
            }
            gone = {tp.partition for tp in revoked if tp.topic == topic}
            dropped = {p for p in kv.owned if p in gone or p not in actives}
            await kv.hand_over(dropped)
            self.forget_transactions(dropped | gone)
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)

    async def restore_ahead(self, partitions: set[int], within: float) -> None:
        """Bring the databases of the partitions this worker is given up to their
        changelog's end before Faust's recovery reads them, with a reader of our own that
        writes each fetch in one batch (Faust's recovery handles a record at a time: about
        8,000 records/s here; this, tens of thousands). Called by Faust's recovery
        (``faust_defects.restore_ahead``), which then starts where this stopped: after
        ``within`` seconds, when the group moves on, or when the read fails, it reads the
        rest itself."""
        if not partitions:
            return
        generation_id = self.app.consumer_generation_id
        deadline = time.monotonic() + within
        store: Any = self.data
        topic = self.changelog_topic_name
        starts: dict[int, int] = {}
        for p in partitions:
            persisted = store.persisted_offset(TP(topic, p))
            starts[p] = 0 if persisted is None else persisted + 1
        written = dict.fromkeys(partitions, 0)

        def take(p: int, records: list[tuple[bytes, bytes | None, int]], end: int | None) -> bool:
            if self.app.consumer_generation_id != generation_id:
                raise _Moved("the group rebalanced again")
            if time.monotonic() > deadline:
                raise _Moved(f"{within:g}s passed")
            db = self.database(p)
            if records:
                db.write([(key, value) for key, value, _ in records], records[-1][2])
                written[p] += len(records)
            if end is not None and end > starts[p]:  # read up to there (markers included)
                db.write([], end - 1)
            return False

        t0 = time.monotonic()
        try:
            await read_committed_into(
                bootstrap_of(self.app), topic, starts, take, idle=self.catch_up_s
            )
        except _Moved as stop:
            log.info("journal restore ahead stopped (%s); Faust's recovery reads the rest", stop)
        except Exception as exc:
            log.warning(
                "journal partitions %s: restore ahead stopped (%r); Faust's recovery reads "
                "the rest",
                sorted(partitions),
                exc,
            )
        total = sum(written.values())
        if total:
            took = time.monotonic() - t0
            log.info(
                "journal partitions %s: %d changelog records restored in %.1fs (%.0f/s)",
                sorted(p for p, n in written.items() if n),
                total,
                took,
                total / max(took, 1e-6),
            )

    def assigned_active(self, partition: int) -> bool:
        """The group's current assignment gives this worker the partition (active)."""
        topic = self.changelog_topic_name
        return any(
            tp.topic == topic and tp.partition == partition
            for tp in self.app.assignor.assigned_actives()
        )

    async def on_recovery_completed(self, active_tps: set[TP], standby_tps: set[TP]) -> None:
        await super().on_recovery_completed(active_tps, standby_tps)
        kv = self.botmesh_kv
        if kv is not None:  # before the inbound partitions resume
            topic = self.changelog_topic_name
            new = {tp.partition for tp in active_tps if tp.topic == topic} - kv.owned
            complete = await self._catch_up(new)
            await kv.assign(p for p in new if p in complete)

    #: The longest the check of a restore against the changelog may take.
    catch_up_s = 10.0

    async def _catch_up(self, partitions: set[int]) -> set[int]:
        """Check the restore of ``partitions`` against the changelog itself, and write what
        it lacks into RocksDB; returns those now complete. Faust can call this with a
        partition it has not restored (a restore overtaken by the next rebalance: the
        partition loaded 0 of its records, and replies its previous owner had sent were
        sent again): whatever Faust did, the journal loads a partition only once its
        database holds every committed changelog record. A partition that cannot be
        checked (the broker out of reach) is not loaded: a record of it fails and its
        batch is given up unacked (the worker restarts)."""
        if not partitions:
            return set()
        store: Any = self.data
        topic = self.changelog_topic_name
        starts = {}
        for p in partitions:
            persisted = store.persisted_offset(TP(topic, p))
            starts[p] = 0 if persisted is None else persisted + 1
        try:
            tails = await read_committed(
                bootstrap_of(self.app), topic, starts, within=self.catch_up_s
            )
        except Exception as exc:
            log.error(
                "journal partitions %s: their restore could not be checked against the "
                "changelog (%r); they are not loaded",
                sorted(partitions),
                exc,
            )
            return set()
        for p, records in sorted(tails.items()):
            if records:
                log.warning(
                    "journal partition %d: the restore lacked %d changelog records (offsets "
                    "%d-%d); written now",
                    p,
                    len(records),
                    records[0][2],
                    records[-1][2],
                )
                self.persist_many(p, records)
        return partitions

    # -- group membership -----------------------------------------------------------------

    def _watch_heartbeats(self) -> None:
        """Record when the coordinator accepts a heartbeat (aiokafka keeps that to itself)."""
        consumer: Any = self.app.consumer  # Faust's aiokafka driver: a consumer thread
        try:
            coordinator = consumer._thread._ensure_consumer()._coordinator
        except Exception as exc:  # another driver: no fence, said once
            if self._watched is None:
                self._watched = False
                log.warning("cannot follow the group's heartbeats (%s): writes not fenced", exc)
            return
        if self._watched is coordinator:
            return
        beat = coordinator._do_heartbeat
        table = self

        async def heartbeat() -> bool:
            t0 = time.monotonic()  # before the request: the coordinator's clock starts later
            ok = bool(await beat())
            if ok:
                table._confirmed = max(table._confirmed, t0)
            return ok

        coordinator._do_heartbeat = heartbeat
        self._watched = coordinator

    def unconfirmed(self) -> str | None:
        if self._watched is False:
            return None
        age = time.monotonic() - self._confirmed
        if age <= self.membership_limit:
            return None
        return (
            f"this worker's group membership was last confirmed {age:.1f}s ago (more than "
            f"half the session timeout, {self.membership_limit:g}s): it may have been evicted "
            "and its partitions given to another worker; writes wait until the group "
            "coordinator accepts a heartbeat again"
        )

    # -- botmesh.streams.table_kv.ChangelogPort ----------------------------------------------------

    async def produce(self, partition: int, key: bytes, value: bytes | None) -> Any:
        if self.transactional:
            return await self._produce_in_transaction(partition, key, value)
        # aiokafka's producer under Faust's (at_least_once: one producer, acks=all), without
        # Faust's per-send wrapper (sensors, header checks): a sixth of a turn's cost
        faust_producer: Any = self.app.producer
        kafka = faust_producer._producer
        if kafka is None:
            kafka = (await self.app.maybe_start_producer())._ensure_producer()
        fut = await kafka.send(
            self.changelog_topic_name, value, key=key, partition=partition, headers=self._writer
        )
        fut.add_done_callback(lambda f: self._acked(partition, key, value, f))
        return fut

    def _acked(self, partition: int, key: bytes, value: bytes | None, fut: Any) -> None:
        kv = self.botmesh_kv
        if kv is None or not kv.loaded(partition):
            return  # not ours (any more): its restore reads it from the changelog
        if fut.cancelled() or fut.exception() is not None:
            kv.broken.add(partition)  # maybe in the log: no later offset may pass it
            return
        # written with the other records acked in this turn of the loop: one RocksDB batch
        # (values, then the offset) per partition instead of two writes per record
        if not self._acked_records:
            asyncio.get_running_loop().call_soon(self._persist_acked)
        self._acked_records.setdefault(partition, []).append((key, value, fut.result().offset))

    def _persist_acked(self) -> None:
        kv = self.botmesh_kv
        acked, self._acked_records = self._acked_records, {}
        for partition, records in acked.items():
            if kv is None or not kv.loaded(partition):
                continue  # revoked or broken meanwhile: its restore reads the changelog
            try:
                self.persist_many(partition, records)
                kv.persisted(partition, (key for key, _, _ in records))
            except Exception as exc:  # the offset must never pass a record not written
                kv.broken.add(partition)
                log.error(
                    "journal partition %d: RocksDB write failed (%s); its next restore "
                    "reads the changelog from the last record written",
                    partition,
                    exc,
                )

    def persist_many(
        self,
        partition: int,
        records: list[tuple[bytes, bytes | None, int]],
        offset: int | None = None,
    ) -> None:
        """Write durable records (key, value, changelog offset) into the partition's
        database, with the changelog offset read so far (``offset``, else the last record's)
        and their index entries in the same atomic batch: the offset never lands without
        the values before it (``JournalDb.write``)."""
        if offset is None:
            offset = max(o for _, _, o in records)
        self.database(partition).write([(key, value) for key, value, _ in records], offset)

    def database(self, partition: int) -> JournalDb:
        # not kept here: Faust closes a revoked partition's database by dropping the last
        # reference to it (RocksDB's lock goes with it, and a new owner can open it)
        store: Any = self.data  # Faust's RocksDB store (its per-partition databases)
        return JournalDb.open(store._db_for_partition(partition), store.offset_key)

    def apply_changelog_batch(self, batch: Iterable[Any]) -> None:
        """Faust's restore and standby updates: each partition's records written with their
        index entries and the offset read, in one batch (``JournalDb.write``)."""
        records: dict[int, list[tuple[bytes, bytes | None]]] = {}
        offsets: dict[int, int] = {}
        for event in batch:
            msg = event.message
            if msg.key is None:  # not a journal record (nothing of ours writes one)
                continue
            records.setdefault(msg.partition, []).append((msg.key, msg.value))
            offsets[msg.partition] = max(msg.offset, offsets.get(msg.partition, -1))
        for partition, written in records.items():
            self.database(partition).write(written, offsets[partition])

    # -- exactly_once: the partition's transaction -----------------------------------------

    #: Set by ``build_app`` under ``exactly_once`` (``start_transactions``).
    transactional = False
    _sent: dict[int, list[_Sent]]
    _waiting: set[int]
    _delayed: set[int]
    _tids: dict[int, str]
    _committers: dict[int, asyncio.Task[None]]

    def start_transactions(self) -> None:
        """Write the changelog in the partitions' Kafka transactions (``exactly_once``)."""
        self.transactional = True
        self._sent = {}
        self._waiting = set()
        self._delayed = set()
        self._tids = {}
        self._committers = {}

    def transactional_id(self, partition: int) -> str:
        """Faust's transactional id of a changelog partition (``TransactionManager``): the
        copartition group's, so the inbound partition's producer writes its journal."""
        tid = self._tids.get(partition)
        if tid is None:  # the topic's group is fixed by the app's topics: asked once
            group = self.app.assignor.group_for_topic(self.changelog_topic_name)
            tid = self._tids[partition] = f"{self.app.conf.id}-{group}-{partition}"
        return tid

    async def _produce_in_transaction(self, partition: int, key: bytes, value: bytes | None) -> Any:
        faust_producer: Any = self.app.producer
        tid = self.transactional_id(partition)
        txp = faust_producer._transaction_producers.get(tid)
        if txp is None:
            raise JournalUnavailableError(
                f"no transactional producer {tid} for journal partition {partition} (revoked?)"
            )
        # as Faust's send does (without its per-send wrapper): the producer of ``tid``
        # under Faust's lock for it, so never inside a commit
        async with faust_producer._trn_locks[tid]:
            ack = await txp.send(
                self.changelog_topic_name, value, key=key, partition=partition, headers=self._writer
            )
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sent.setdefault(partition, []).append(_Sent(key, value, ack, txp, done))
        return done

    def commit_soon(self, partitions: Sequence[int], delay: float = 0.0) -> None:
        if delay > 0:
            loop = asyncio.get_running_loop()
            for p in set(partitions) - self._delayed:
                self._delayed.add(p)
                loop.call_later(delay, self._commit_delayed, p)
            return
        for p in partitions:
            self._waiting.add(p)
            if p not in self._committers:
                task = asyncio.get_running_loop().create_task(self._commit_loop(p))
                self._committers[p] = task

    def _commit_delayed(self, p: int) -> None:
        self._delayed.discard(p)
        if self.transactional and not self._stopped_transactions:
            self.commit_soon([p])

    _stopped_transactions = False

    async def on_stop(self) -> None:
        # a clean stop: the streams are done, the producers still run, RocksDB is open:
        # commit what waits (NO_BARRIER writes), so the next start replays none of it
        if self.transactional and not self._stopped_transactions:
            self._stopped_transactions = True
            for p in sorted(self._sent):
                try:
                    await self._commit_once(p)
                except Exception:
                    log.exception("journal partition %d: last transaction commit failed", p)
        await super().on_stop()

    async def _commit_loop(self, p: int) -> None:
        """One transaction commit after another while journal commits ask for one: every
        record sent before a commit takes the producer's lock is in that transaction."""
        try:
            while p in self._waiting:
                self._waiting.discard(p)
                await self._commit_once(p)
        except Exception as exc:  # e.g. RocksDB: the records wait no longer
            log.exception("journal partition %d: transaction commit failed", p)
            _settle(self._sent.pop(p, []), None, f"{type(exc).__name__}: {exc}")
        finally:
            self._committers.pop(p, None)

    async def _commit_once(self, p: int) -> None:
        faust_producer: Any = self.app.producer
        tid = self.transactional_id(p)
        txp = faust_producer._transaction_producers.get(tid)
        lock = faust_producer._trn_locks.get(tid)
        if txp is None or lock is None:
            _settle(self._sent.pop(p, []), None, f"no transactional producer {tid} (revoked?)")
            return
        async with lock:  # Faust's own: no send, no offset commit of Faust's meanwhile
            batch = self._sent.pop(p, [])
            # ended: Faust committed it without a next one (``wait_empty``: a stop, a
            # rebalance); it begins the next one itself
            committed = _ended(txp)
            if not committed:
                try:
                    await txp.commit_transaction()
                    committed = True
                except Exception as exc:
                    why = f"transaction {tid} not committed: {type(exc).__name__}: {exc}"
                    log.warning("journal partition %d: %s; aborting it", p, why)
                    # aborted: nothing of it reaches RocksDB
                    # fenced: ProducerFenced here, or an assertion from a producer that
                    # another path found fenced (aiokafka's fatal state)
                    fenced = isinstance(exc, ProducerFenced) or _fatal(txp)
                    _settle(batch, None, why, fenced=fenced)
                    with contextlib.suppress(Exception):
                        await txp.abort_transaction()
                try:
                    await txp.begin_transaction()
                except Exception as exc:
                    # the next send fails (not in a transaction): the journal is
                    # unavailable until Faust starts a producer for the partition again
                    log.error("journal partition %d: transaction %s not begun: %r", p, tid, exc)
        if committed:  # this producer's records reach RocksDB, in the order sent
            records = [
                (s.key, s.value, s.ack.result().offset)
                for s in batch
                if s.txp is txp and _acked(s.ack)  # a commit that timed out too
            ]
            if records:
                # the commit's marker follows the transaction's last record (this producer
                # is the partition's only writer, and every record it sent is in the
                # batch): counted as read, so a restore does not wait for a record there
                # (Faust's recovery waits twice its 5 s poll before it gives up on one)
                self.persist_many(p, records, offset=records[-1][2] + 1)
                if self.botmesh_kv is not None:
                    self.botmesh_kv.persisted(p, (key for key, _, _ in records))
            _settle(batch, txp, "sent by a producer Faust replaced (its transaction is lost)")

    def forget_transactions(self, partitions: set[int]) -> None:
        """Revoked partitions: their records not committed yet never will be (here)."""
        if self.transactional:
            for p in partitions:
                _settle(self._sent.pop(p, []), None, "journal partition revoked")


class _Moved(Exception):
    """A restore ahead gives the rest to Faust (``JournalTable.restore_ahead``)."""


class _Sent(NamedTuple):
    """A changelog record in an open transaction, waiting for the commit."""

    key: bytes
    value: bytes | None
    ack: Any  # aiokafka's future: the broker's ack
    txp: Any  # the transactional producer it went to
    done: asyncio.Future[None]  # what the journal awaits: resolved at the commit


def _ended(txp: Any) -> bool:
    """The producer's last transaction ended with a commit and no other began: Faust's
    ``commit_and_end_transactions`` (it never aborts: a fenced producer is dropped, and the
    journal's own abort begins the next transaction under the same lock)."""
    state = txp._txn_manager.state
    return bool(state == TransactionState.READY)


def _fatal(txp: Any) -> bool:
    """The producer failed for good (aiokafka's ``FATAL_ERROR``: its sender stopped on an
    error such as ``ProducerFenced``): no transaction of it commits any more."""
    return bool(txp._txn_manager.state == TransactionState.FATAL_ERROR)


def _acked(ack: Any) -> bool:
    return bool(ack.done() and not ack.cancelled() and ack.exception() is None)


def _settle(batch: list[_Sent], committed: Any, why: str, *, fenced: bool = False) -> None:
    """Resolve the records that ``committed`` (a producer, None: none) committed; fail the
    others with ``JournalUnavailableError(why)`` (``ProducerFencedOut`` when a newer
    producer fenced the transaction)."""
    error = ProducerFencedOut if fenced else JournalUnavailableError
    for s in batch:
        if s.done.done():
            continue
        if committed is not None and s.txp is committed:
            if _acked(s.ack):
                s.done.set_result(None)
                continue
            why = "a changelog record of the transaction was not acked"
        s.done.set_exception(error(why))
        s.done.exception()  # retrieved: a journal commit that timed out no longer awaits it
