"""The Kafka worker: a Faust app whose inbound agent runs a bot on the journal it chose.

``run_worker(bot, provider, WorkerConfig.from_env())`` provisions the topics, binds the bot
(``bot.bind(provider, config.journal_url, instance_id=..., receipts=KafkaReceipts(...))``)
and runs it with Faust's worker: the runtime starts before the agent and stops after it
(SIGTERM / Ctrl-C: the batch in progress finishes, offsets are committed, the runtime
stops and records its last receipts published). A stop has ``BOTMESH_STOP_TIMEOUT``
seconds (30): past them the worker prints its threads' stacks and exits with status 70
without acking (a provider call that hangs holds the batch, so the stop, for ever).

The agent reads ``<prefix>.inbound`` and ``<prefix>.requests`` (sends from outside a
handler) as one Faust topic, in batches (``take_events``), and hands each batch to
``botmesh.streams.runner.InboundRunner``, which settles every record (an ``Outcome`` of
``runtime.handle()``, a request's send through ``runtime.send()``, or a dead letter on
``<prefix>.inbound.dlq`` / ``<prefix>.requests.dlq``) before the batch is acked; see that
module for the outcome table, the retries of a journal outage and how far a failing chat
holds up others. Both topics have the inbound's partition count, so Faust's assignor
co-partitions them with the journal's changelog: whoever owns partition ``p`` of the
inbound owns ``p`` of the requests and of the journal (the worker refuses to start when the
requests topic has another partition count). Receipts of every settled send (``sent``, ``dead``,
``unknown``) go to ``<prefix>.sent``, keyed by chat id, with acks=all; the journal keeps
each one unpublished until its ack, so a crash loses none.

Nothing raised in the batch body reaches Faust (which would ack and commit the whole
batch, ``faust-durable-flush.md`` 5.1): a batch that cannot be settled (a retry past the
batch deadline, a stop while records wait for a retry, a dead letter the broker refused,
a cancel in the middle of a batch) makes the process exit at once without acking
(``os._exit``: status 75 for an abandoned batch, 70 otherwise); the broker redelivers the
batch and the journal answers what was settled already as duplicates. A journal that cannot
be opened at start (a missing folder, another process holding it, a corrupt file) stops the
worker with its message and status 2.

Group membership: with an explicit instance id (``--instance-id`` / ``BOTMESH_INSTANCE_ID``)
the consumer is a static member (``group.instance.id``): a restarted worker gets its
partitions back at once, without a rebalance, instead of waiting for the killed member's
session to time out; a static member does not leave the group when it stops, so its
partitions wait ``session_timeout`` before another member takes them. Without one it is a
dynamic member and a killed worker holds its partitions for ``session_timeout``
(``BOTMESH_SESSION_TIMEOUT``, default 30 s; Faust's own default is 60 s).

Joining: the consumer subscribes, and so joins the group, only once the broker lists every
topic of the subscription (``BOTMESH_TOPIC_WAIT``, 60 s; then status 2 naming the missing
ones), and a worker left with no inbound partition while some have no owner leaves the group
to force a rebalance (``botmesh.streams.membership``). Every client of the worker connects
with the same TLS and SASL settings (``WorkerConfig.kafka``, ``botmesh.streams.connection``).

Environment: see ``botmesh.streams.config.WorkerConfig``.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, NoReturn

import faust
from aiokafka.errors import ProducerFenced
from aiokafka.producer.transaction_manager import TransactionState
from faust.types import TP

from botmesh.state.backoff import RETRY_TIERS
from botmesh.state.errors import ConfigError, DurabilityError, JournalUnavailableError
from botmesh.state.kv import DurableKv
from botmesh.state.ports import Provider
from botmesh.streams.config import WorkerConfig, group_instance_id
from botmesh.streams.connection import Brokers, faust_options
from botmesh.streams.faust_defects import (
    bootstrap_of,
    read_committed,
    read_committed_into,
)
from botmesh.streams.faust_defects import install as install_workarounds
from botmesh.streams.journal_db import JournalDb
from botmesh.streams.membership import AssignmentWatch, TopicsNotListed, wait_for_topics
from botmesh.streams.operator import metrics_record
from botmesh.streams.provision import ensure_topics, existing_topics
from botmesh.streams.retry_tiers import Parked, RetryTiers, parked_record
from botmesh.streams.runner import (
    BatchAbandoned,
    BotDefinition,
    Headers,
    InboundRunner,
    KafkaReceipts,
    RawRecord,
    RuntimeLike,
)
from botmesh.streams.table_kv import (
    CURRENT_PARTITION,
    TABLE_NAME,
    ProducerFencedOut,
    TableKv,
    in_partition,
)
from botmesh.topics.catalog import Catalog, TopicSpec
from botmesh.topics.dead_letters import redact

__all__ = ["build_app", "run_worker"]

log = logging.getLogger("botmesh.streams")

EXIT_CONFIG = 2  # as the CLI's refusals: the journal cannot be opened (missing, locked...)
EXIT_ABANDONED = 75  # EX_TEMPFAIL: try again later
EXIT_SOFTWARE = 70


class _BotApp(faust.App):
    """The Faust app with the runtime's lifecycle: started before the agents, stopped
    after them (while the producer still runs, so the last receipts are acked)."""

    botmesh_runtime: RuntimeLike | None = None
    botmesh_runner: InboundRunner | None = None
    botmesh_pipeline: Pipeline | None = None
    botmesh_tiers: RetryTiers | None = None
    botmesh_about = ""
    #: publishes the counters once more at a clean stop (``build_app``)
    botmesh_last_metrics: Callable[[], Awaitable[None]] | None = None
    #: the readiness and the empty-assignment check (``botmesh.streams.membership``)
    botmesh_watch: AssignmentWatch | None = None
    botmesh_kafka: Brokers = ""
    #: seconds the join waits for the broker to list the subscribed topics
    botmesh_topic_wait = 60.0
    _runtime_started = False
    _watching: Any = None

    async def on_start(self) -> None:
        self._join_when_listed()
        await super().on_start()
        if self.botmesh_runtime is not None and not self._runtime_started:
            try:
                await self.botmesh_runtime.start()
            except (DurabilityError, ConfigError) as exc:  # the operator's to fix: no traceback
                _exit_at_start(f"cannot start the bot on its journal: {exc}")
            self._runtime_started = True
            log.info("runtime started: %s", self.botmesh_about)
            if self.botmesh_tiers is not None:
                self.botmesh_tiers.start()

    def _join_when_listed(self) -> None:
        """The consumer subscribes (and so joins the group) only once the broker's metadata
        lists every topic of the subscription (``botmesh.streams.membership``); then the assignment
        watch starts."""
        consumer: Any = self.consumer
        subscribe = consumer.subscribe
        watch = self.botmesh_watch

        async def subscribe_when_listed(topics: Any) -> None:
            names = sorted(set(topics))
            try:
                await wait_for_topics(self.botmesh_kafka, names, self.botmesh_topic_wait)
            except (TopicsNotListed, ConnectionError) as exc:
                _exit_at_start(str(exc))
            await subscribe(names)
            if watch is not None and self._watching is None:
                self._watching = self.add_future(watch.run())

        consumer.subscribe = subscribe_when_listed

    async def on_stop(self) -> None:
        if self.botmesh_tiers is not None:
            await self.botmesh_tiers.stop()
        if self.botmesh_runner is not None:
            self.botmesh_runner.stopping.set()
        if self.botmesh_pipeline is not None:  # settled and acked while the consumer runs
            await self.botmesh_pipeline.join()
        await super().on_stop()  # stops the consumer, waiting for the batch in progress
        if self.botmesh_last_metrics is not None:
            await self.botmesh_last_metrics()
        await self._stop_runtime()

    async def on_shutdown(self) -> None:
        await super().on_shutdown()
        await self._stop_runtime()

    async def _stop_runtime(self) -> None:
        if self.botmesh_runtime is not None and self._runtime_started:
            self._runtime_started = False
            await self.botmesh_runtime.stop()


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


#: RocksDB settings of each journal partition's database. Faust's defaults (memtables of
#: 64 MiB, three of them, and a 2 GiB block cache, per partition) let a worker's memory grow
#: by hundreds of MiB with a restore or a scan; the journal reads little and writes small
#: batches, so each partition gets at most 2 x 16 MiB of memtables and a 32 MiB cache.
JOURNAL_ROCKSDB: Mapping[str, int] = {
    "write_buffer_size": 16 * 2**20,
    "max_write_buffer_number": 2,
    "block_cache_size": 32 * 2**20,
}


class Pipeline:
    """The batches of the inbound agent, settled side by side so that no chat waits for
    another: each batch Faust's ``take_events`` hands over is started at once
    (``InboundRunner.run_batch``: a chat's records wait for its records of the batches
    before, nothing else does), and its records are acked once it settled. Each message
    gets one more reference before ``take_events`` acks it, so that ack is not the last and
    only ours marks it done: Faust commits a partition up to its lowest record not settled
    (``faust_defects.guard_commit_holes`` holds the commit at a record in flight). At most
    ``limit`` records are taken and not settled: beyond, the agent waits, Faust's buffers
    fill and it pauses fetching. A batch that cannot be settled ends the process without
    acking it, as before."""

    def __init__(self, runner: InboundRunner, consumer: Callable[[], Any], limit: int) -> None:
        self.runner = runner
        self._consumer = consumer
        self.limit = max(limit, 1)
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, events: Sequence[Any]) -> None:
        messages = [ev.message for ev in events]
        for message in messages:  # first: the ack ending ``take_events`` is not the last
            message.incref()
        runner = self.runner
        try:
            while runner.unsettled and runner.unsettled + len(messages) > self.limit:
                runner.settled.clear()
                await runner.settled.wait()
        finally:
            # started whatever happens, even when the worker stops (the agent cancelled
            # here): Faust's consumer waits for every message it handed over to be acked
            # before it stops; a stop cuts only retry waits short
            self._start([_raw_record(message) for message in messages], messages)

    def _start(self, records: list[RawRecord], messages: list[Any]) -> None:
        task = asyncio.get_running_loop().create_task(self._run(records, messages))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, records: list[RawRecord], messages: list[Any]) -> None:
        try:
            await self.runner.run_batch(records)
        except BatchAbandoned as exc:
            _exit_hard(str(exc), EXIT_ABANDONED)
        except asyncio.CancelledError:
            _exit_hard("cancelled in the middle of a batch", EXIT_SOFTWARE)
        except BaseException as exc:  # acked, it would be committed unsettled
            _exit_hard(f"{type(exc).__name__}: {exc}", EXIT_SOFTWARE)
        consumer = self._consumer()
        for message in messages:
            message.ack(consumer)

    async def join(self) -> None:
        """Wait for every batch started to be settled and acked."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))


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


def _changelog_spec(config: WorkerConfig) -> TopicSpec:
    name = config.catalog.changelog(TABLE_NAME)
    specs = config.catalog.specs(config.partitions, config.replication)
    return next(s for s in specs if s.name == name)


def _exit_at_start(why: str) -> NoReturn:
    """The operator's to fix (a journal that cannot be opened, topics that are not there):
    the message without a traceback, status 2; nothing was consumed yet."""
    print(f"botmesh worker: {why}", file=sys.stderr, flush=True)
    log.critical("exiting before consuming anything: %s", why)
    logging.shutdown()
    os._exit(EXIT_CONFIG)


def _exit_hard(why: str, code: int) -> NoReturn:
    """Leave without acking anything: the broker redelivers from the committed offsets."""
    log.critical("exiting without acking the batch in progress: %s", why)
    logging.shutdown()
    sys.stderr.flush()
    os._exit(code)


def build_app(bot: BotDefinition, provider: Provider, config: WorkerConfig) -> Any:
    """The Faust app (untyped, hence ``Any``) running ``bot`` on ``config``'s topics; its
    ``botmesh_runtime`` and ``botmesh_runner`` attributes are the bound bot and the runner.
    What connects the app and the engine is a ``Wiring``'s named methods."""
    cat = config.catalog
    install_workarounds(exactly_once=config.exactly_once)  # faust_defects.REGISTER
    app = _new_app(config)
    wiring = Wiring(app, config)
    # one topic object, three names: Faust co-partitions them (and the journal's changelog)
    inbound = app.topic(
        cat.inbound,
        cat.requests,
        cat.control,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
    )
    journal: str | DurableKv = config.journal_url
    if config.kafka_journal:
        journal = wiring.open_journal()
    runtime = wiring.runtime = bot.bind(
        provider,
        journal,
        instance_id=config.instance_id,
        receipts=KafkaReceipts(wiring.produce),
    )
    instance = str(getattr(runtime, "instance_id", config.instance_id or ""))
    kv = wiring.kv
    if kv is not None:
        assert wiring.table is not None
        wiring.table.writer_id = instance
        kv.on_assigned = wiring.recover
        kv.on_revoking = runtime.flush_receipts  # receipts recorded while the chats are ours
        kv.on_lost = wiring.lost
    runner = wiring.runner = InboundRunner(
        runtime,
        wiring.produce,
        batch_deadline=config.batch_deadline,
        owns=kv.owns if kv is not None else None,
        requests_topic=cat.requests,
        control_topic=cat.control,
        instance=instance,
        # the limit the app's producer checks each record against (dead letters are cut)
        max_request_size=int(app.conf.producer_max_request_size),
        flush=kv.flush if kv is not None else None,
    )
    app.botmesh_runtime = runtime
    app.botmesh_runner = runner
    app.botmesh_tiers = RetryTiers(config.kafka, cat, wiring.owned, wiring.retry, wiring.repark)
    app.botmesh_topic_wait = config.topic_wait
    app.botmesh_watch = AssignmentWatch(
        bootstrap=config.kafka,
        group=cat.group,
        topic=cat.inbound,
        owned=wiring.inbound_assigned,
        instance_id=None if config.instance_id is None else group_instance_id(config.instance_id),
        member_id=wiring.member_id,
        rebalancing=lambda: bool(app.rebalancing),
    )
    app.botmesh_pipeline = wiring.pipeline = Pipeline(
        runner, lambda: app.consumer, config.in_flight
    )
    app.agent(inbound, name=f"{cat.app_id}.inbound", concurrency=1)(wiring.process)
    _publish_metrics(app, runtime, cat.metrics, config)
    app.botmesh_about = (
        f"bot {bot.bot_id} on {cat.inbound}, {cat.requests} and {cat.control}, "
        f"journal {redact(config.journal_url)}"
        f"{' (' + cat.changelog(TABLE_NAME) + ')' if kv is not None else ''}, "
        f"instance {config.instance_id or '(the runtime default)'}, provider {provider.name}, "
        f"Kafka at {config.bootstrap} ({config.security.describe()})"
    )
    return app


def _new_app(config: WorkerConfig) -> Any:
    """The Faust app with the worker's settings (no agent, no table yet)."""
    web: dict[str, Any] = {"web_enabled": False}
    if config.web_port is not None:
        web = {
            "web_enabled": True,
            "web_bind": "127.0.0.1",
            "web_host": "127.0.0.1",
            "web_port": config.web_port,
        }
    membership: dict[str, Any] = {
        "broker_session_timeout": config.session_timeout,
        "broker_heartbeat_interval": min(3.0, config.session_timeout / 3),
    }
    if config.instance_id is not None:
        membership["consumer_group_instance_id"] = group_instance_id(config.instance_id)
    app = _BotApp(
        config.catalog.app_id,
        **faust_options(config.kafka),
        store="rocksdb://",
        datadir=str(config.data_dir),
        processing_guarantee="exactly_once" if config.exactly_once else "at_least_once",
        producer_acks=-1,
        consumer_auto_offset_reset="earliest",
        # one standby replica under both guarantees, so a takeover has the partition at
        # hand (standbys that skipped records were a Faust fetch defect, worked around:
        # ``faust_defects.fetch_only_active``)
        table_standby_replicas=1,
        topic_partitions=config.partitions,
        topic_replication_factor=config.replication,
        topic_allow_declare=True,
        worker_redirect_stdouts=False,
        **membership,
        **web,
    )
    app.botmesh_kafka = config.kafka  # the clients of our own: TLS and SASL as Faust's
    return app


class Wiring:
    """What connects the Faust app and the engine (``build_app``): the producer the runtime
    and the runner write through, the journal's callbacks, the retry tiers' and the
    assignment watch's questions, and the inbound agent."""

    runtime: RuntimeLike
    runner: InboundRunner
    pipeline: Pipeline

    def __init__(self, app: Any, config: WorkerConfig) -> None:
        self.app = app
        self.config = config
        cat = self.cat = config.catalog
        self.table: JournalTable | None = None
        self.kv: TableKv | None = None
        self._names = {
            "sent": cat.sent,
            "dlq": cat.inbound_dlq,
            "requests-dlq": cat.requests_dlq,
            "outbox-dlq": cat.outbox_dlq,
            "control-results": cat.control_results,
            **{f"retry:{name}": cat.retry(name) for name, _ in RETRY_TIERS},
        }

    def open_journal(self) -> TableKv:
        """The journal on Kafka: a Faust table in RocksDB under ``TableKv``."""
        config = self.config
        table = self.table = JournalTable(
            self.app,
            name=TABLE_NAME,
            beacon=self.app.tables.beacon,
            key_type=bytes,
            value_type=bytes,
            partitions=config.partitions,
            # as provisioned (Faust creates it with these when provisioning is off)
            extra_topic_configs=dict(_changelog_spec(config).config),
            options=dict(JOURNAL_ROCKSDB),
        )
        table.membership_limit = config.session_timeout / 2
        if config.exactly_once:
            table.start_transactions()
        self.app.tables.add(table)
        kv = self.kv = table.botmesh_kv = TableKv(table)
        return kv

    async def produce(self, role: str, key: bytes | None, value: bytes, headers: Headers) -> Any:
        """Hand a record of ``role`` to the producer (``botmesh.streams.runner.Produce``)."""
        # the driver's send (aiokafka accumulator), not Topic.send: ~2x less work per record;
        # under exactly_once the app's plain producer too (idempotent, acks=all), not the
        # TransactionManager: receipts and dead letters are visible (and durable) on their
        # ack, as under at_least_once (the TransactionManager would pick a producer by the
        # receipts topic's partition, which Faust's assignor has no group for: KeyError)
        app = self.app
        await app.producer.maybe_start()
        producer: Any = app.producer
        # a parked send goes to its journal partition's tier partition: the worker that owns
        # the chat takes it back, whichever partitioner the inbound's producers use
        partition = CURRENT_PARTITION.get() if role.startswith("retry:") else None
        return await producer.send(self._names[role], key, value, partition, None, headers or None)

    async def recover(self, partition: int) -> None:
        """The recovery pass of a journal partition just opened (``TableKv.on_assigned``)."""
        ops = self.runtime.durability if self.app._runtime_started else None
        if ops is not None:
            acted = await ops.recover()
            log.info("journal partition %d recovered (%d records acted on)", partition, acted)

    def lost(self, partition: int, exc: BaseException) -> None:
        """Under ``exactly_once``: a transaction under writes that returned early (TableKv's
        ``NO_BARRIER``) failed; memory holds what the changelog lost: restart from it."""
        if self.runner.stopping.is_set():  # stopping anyway: as a crash here would
            log.warning("journal partition %d: last writes not committed: %s", partition, exc)
            return
        assert self.table is not None
        if not self.table.assigned_active(partition):
            # a rebalance in progress took it (Faust stopped its producer first): the
            # hand-over drops it from memory, and its new owner restores without them
            log.info("journal partition %d: revoked with its last writes uncommitted", partition)
            return
        if isinstance(exc, ProducerFencedOut):  # evicted: another worker owns it now
            _exit_hard(
                f"journal partition {partition}: this worker's transaction was fenced by "
                f"a newer producer, so another worker owns the partition ({exc}); "
                "restarting to rejoin the group",
                EXIT_ABANDONED,
            )
        _exit_hard(
            f"journal partition {partition}: a transaction holding returned writes was "
            f"not committed ({type(exc).__name__}: {exc})",
            EXIT_SOFTWARE,
        )

    def inbound_assigned(self) -> set[int]:
        """The inbound partitions the consumer has now."""
        try:
            tps = self.app.consumer.assignment()
        except Exception:  # not started yet
            return set()
        return {tp.partition for tp in tps if tp.topic == self.cat.inbound}

    def owned(self) -> set[int]:
        """The partitions (inbound, journal, tiers) this worker owns now."""
        mine = self.inbound_assigned()
        kv = self.kv
        return {p for p in mine if kv.owns(p)} if kv is not None else mine

    async def retry(self, partition: int, parked: Parked) -> str:
        """A parked send back from its retry tier, retried in its journal partition."""
        ops = self.runtime.durability
        if ops is None:
            return "stale"
        with in_partition(partition):
            return await ops.retry_parked(parked.key, parked.attempts)

    async def repark(self, parked: Parked, tier: str) -> Any:
        """A parked send put back on its tier (acked)."""
        value = {"key": parked.key, "attempts": parked.attempts}
        value["payload"] = {"chat_id": parked.chat_id}
        tier, key, body, headers = parked_record(value, parked.retry_at)
        return await (await self.produce(f"retry:{tier}", key, body, headers))

    def member_id(self) -> str | None:
        """The consumer's group member id (``None`` before it joined)."""
        consumer: Any = self.app.consumer  # Faust's aiokafka driver: a consumer thread
        try:
            return str(consumer._thread._ensure_consumer()._coordinator.member_id)
        except Exception:  # not started yet, or another driver
            return None

    async def process(self, stream: Any) -> None:
        """The inbound agent: each batch handed to the pipeline as it is taken."""
        config = self.config
        async for events in stream.take_events(config.batch_size, within=config.batch_within):
            await self.pipeline.submit(events)


def _publish_metrics(app: Any, runtime: RuntimeLike, topic: str, config: WorkerConfig) -> None:
    """Every ``config.metrics_interval`` seconds, and once at a clean stop, produce the
    engine's counters to ``topic`` (``<prefix>.metrics``, keyed by the instance id)."""
    instance = str(getattr(runtime, "instance_id", config.instance_id or ""))

    async def publish(*_: Any) -> None:  # Faust passes the app to a timer that takes one
        ops = runtime.durability if app._runtime_started else None
        if ops is None:
            return
        counters = ops.metrics()
        watch = app.botmesh_watch
        if watch is not None:
            counters["forcedRebalances"] = watch.forced
        key, value = metrics_record(instance, counters, time.time())

        async def send() -> None:
            await app.producer.maybe_start()
            await (await app.producer.send(topic, key, value, None, None, None))

        try:  # bounded: a broker that is down must not hold up a clean stop
            await asyncio.wait_for(send(), timeout=10.0)
        except Exception as exc:  # counters are best effort: never stop the worker
            log.warning("cannot publish the metrics to %s: %s: %s", topic, type(exc).__name__, exc)

    app.timer(config.metrics_interval, name=f"{topic}.publish")(publish)
    app.botmesh_last_metrics = publish


def _raw_record(msg: Any) -> RawRecord:
    return RawRecord(
        topic=msg.topic,
        partition=msg.partition,
        offset=msg.offset,
        key=msg.key,
        value=msg.value,
        headers=_headers(msg.headers),
        timestamp=msg.timestamp,
    )


def _headers(headers: Any) -> list[tuple[str, bytes]]:
    if not headers:
        return []
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [(str(k), bytes(v) if v is not None else b"") for k, v in items]


def _check_copartitioned(cat: Catalog, have: Mapping[str, int]) -> None:
    """Refuse to run when the requests topic and the inbound have other partition counts: a
    chat's requests would land on another partition than its messages and its journal."""
    inbound = have.get(cat.inbound)
    for name, what in ((cat.requests, "send requests"), (cat.control, "operator actions")):
        count = have.get(name)
        if inbound is not None and count is not None and inbound != count:
            raise ConfigError(
                "topics",
                f"{name} has {count} partitions but {cat.inbound} has {inbound}: a chat's "
                f"{what} must land on the partition of its inbound messages; once {name} is "
                f"drained, delete it and let the worker create it again (with {inbound} "
                "partitions)",
            )


class _Worker(faust.Worker):
    """Faust's worker with a limit on its stop: ``stop_timeout`` seconds after the signal
    (SIGTERM / Ctrl-C) a stop still under way ends with the process (``_stop_overdue``)."""

    stop_timeout = 30.0

    def _schedule_shutdown(self, signal_: signal.Signals) -> None:
        if not self._signal_stop_time:  # the first signal: the stop starts
            timer = threading.Timer(self.stop_timeout, _stop_overdue, (self.stop_timeout,))
            timer.daemon = True
            timer.start()
        super()._schedule_shutdown(signal_)


def _stop_overdue(limit: float) -> None:
    """A stop that outlasted its limit (a provider call that hangs, a server that waits on
    its clients): the stacks of every thread go to stderr, then the process exits without
    acking; what was not committed is redelivered and the journal answers the duplicates."""
    log.critical("the worker did not stop within %gs (BOTMESH_STOP_TIMEOUT); its threads:", limit)
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    _exit_hard(f"the stop took longer than {limit:g}s", EXIT_SOFTWARE)


def run_worker(bot: BotDefinition, provider: Provider, config: WorkerConfig) -> None:
    """Provision the topics (idempotent), then run the worker until SIGTERM / Ctrl-C."""
    if config.provision:
        have = existing_topics(config.kafka)
        specs = config.catalog.specs_beside(have, config.partitions, config.replication)
        result = ensure_topics(config.kafka, specs)
        if result.created:
            log.info("created topics: %s", ", ".join(result.created))
        made = {s.name: s.partitions for s in specs if s.name in result.created}
        _check_copartitioned(config.catalog, {**have, **made})
    config.data_dir.mkdir(parents=True, exist_ok=True)
    app = build_app(bot, provider, config)
    worker = _Worker(app, loglevel=config.loglevel, redirect_stdouts=False)
    worker.stop_timeout = config.stop_timeout
    # Faust's progress spinner sets the root logger to DEBUG at a level of warning or above,
    # so every aiokafka debug call builds a record: 30-40% of a durable worker's time.
    worker.spinner = None
    worker.execute_from_commandline()
