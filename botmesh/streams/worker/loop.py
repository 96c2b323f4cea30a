"""The worker's loop on librdkafka: its one consumer, its one producer, its journal, and the
batches between them. Built beside ``botmesh.streams.faust_app`` (``BOTMESH_RUNTIME=
librdkafka`` runs it; the Faust app stays the default until the kill suite holds on this).

A worker (``Worker.run``):

1. provisions the topics (idempotent) and starts its one producer (``RdChangelog``:
   transactional under ``exactly_once``, one ``transactional.id`` for the worker), the
   journal on it (``TableKv``), the bot's runtime on the journal, and the runner
   (``botmesh.streams.runner.InboundRunner``) whose receipts and dead letters go out through
   the same producer (``RdChangelog.send``: in the transaction under ``exactly_once``);
2. joins the group with its one consumer (``ConsumerThread``: cooperative-sticky, static
   membership, the requests and control partitions co-assigned with the inbound's);
3. for each partition it is given, restores the journal partition's RocksDB from the
   changelog (``restore``), opens it (the recovery pass runs), then resumes it;
4. hands each consumed batch to the runner at once (a chat's records wait only for its own
   records of earlier batches), at most ``in_flight`` records unsettled (then it pauses
   fetching), and after each settled batch runs the checkpoint (``Checkpoint``: the
   journal's deferred writes made durable, then the offsets committed; under
   ``exactly_once`` the offsets go into the transaction, which commits them with the
   journal's records, the receipts and the dead letters);
5. before a partition is taken away, settles what is in flight and checkpoints; a lost
   partition (the group moved on) is dropped with nothing committed;
6. on SIGTERM (or ``stop``) stops fetching, settles what is in flight, checkpoints, records
   the receipts published, flushes the journal, and closes the consumer without leaving
   the group (a static member's restart gets its partitions back without a rebalance).

A batch that cannot be settled (``BatchAbandoned``, a fence) ends the process at once
without acking it (``os._exit``: 75, or 70 for anything else), as the Faust app does: the
broker hands the batch to the next owner, and the journal answers what was settled.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any, NoReturn

from confluent_kafka import Message, TopicPartition

from botmesh.state.errors import ConfigError, DurabilityError
from botmesh.state.ports import Provider
from botmesh.streams.config import WorkerConfig
from botmesh.streams.groups import describe_group
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
from botmesh.streams.table_kv import CURRENT_PARTITION, TABLE_NAME, TableKv, in_partition
from botmesh.streams.worker.changelog import RdChangelog
from botmesh.streams.worker.checkpoint import Checkpoint, TopicPart
from botmesh.streams.worker.clients import worker_consumer_config, worker_producer_config
from botmesh.streams.worker.consumer import Batch, ConsumerThread
from botmesh.streams.worker.restore import open_database, restore

__all__ = ["EXIT_ABANDONED", "EXIT_SOFTWARE", "Worker", "run_worker"]

log = logging.getLogger("botmesh.streams")

EXIT_ABANDONED = 75  # EX_TEMPFAIL: a batch given up, start again
EXIT_SOFTWARE = 70


def _exit_hard(why: str, code: int) -> NoReturn:
    """Leave without acking anything: the broker redelivers from the committed offsets."""
    log.critical("exiting without acking the batch in progress: %s", why)
    logging.shutdown()
    sys.stderr.flush()
    os._exit(code)


#: The header a record gets in place of headers librdkafka's binding cannot hand over
#: (a header key that is not UTF-8: ``Message.headers()`` raises on it, a
#: ``UnicodeDecodeError`` wrapped in a ``SystemError`` in confluent-kafka 2.16).
UNREADABLE_HEADERS = "headers.unreadable"


def _raw(msg: Message[Any, Any]) -> RawRecord:
    _, stamp = msg.timestamp()
    try:
        headers = _headers(msg.headers())
    except (UnicodeDecodeError, SystemError) as exc:  # settled all the same, headers lost
        log.warning(
            "%s:%s:%s: headers dropped, a header key is not UTF-8 (%s)",
            msg.topic(),
            msg.partition(),
            msg.offset(),
            exc,
        )
        headers = [(UNREADABLE_HEADERS, b"a header key is not UTF-8: the headers were dropped")]
    return RawRecord(
        topic=str(msg.topic()),
        partition=int(msg.partition() or 0),
        offset=int(msg.offset() or 0),
        key=msg.key(),
        value=msg.value(),
        headers=headers,
        timestamp=stamp / 1000 if stamp and stamp > 0 else None,
    )


def _headers(headers: Any) -> list[tuple[str, bytes]]:
    """A consumed record's headers as ``(name, value)`` pairs (a value may be ``None``, or
    text from a client that sent one)."""
    out: list[tuple[str, bytes]] = []
    for name, value in headers or ():
        raw = value.encode() if isinstance(value, str) else value
        out.append((str(name), bytes(raw) if raw is not None else b""))
    return out


class Membership:
    """Fenced by the group: when this worker's membership was last confirmed.

    Under ``at_least_once`` nothing on the broker stops a worker that lost its partitions
    from producing to their changelog, and a worker thawed after a freeze (``SIGSTOP``, a
    long pause) past the session timeout does not know yet that it was evicted. librdkafka
    keeps its heartbeats to itself, so this asks the group coordinator: every quarter of the
    session timeout, a describe of the group that lists this consumer's member id confirms
    the membership as of the moment the question was sent (an assignment confirms it too).
    A journal write is refused while the last confirmation is older than half the session
    timeout (``unconfirmed``): the coordinator evicts a member only a whole session timeout
    after its last heartbeat, so a write that passed leaves at least half of it before
    another worker can own the partition."""

    def __init__(self, consumer: ConsumerThread, config: WorkerConfig) -> None:
        self._consumer = consumer
        self._brokers = config.kafka
        self._group = config.catalog.group
        self.limit = config.session_timeout / 2
        self.interval = config.session_timeout / 4
        self.confirmed = time.monotonic()
        #: Questions the coordinator answered without this member (it was evicted).
        self.missing = 0

    def confirm(self, at: float | None = None) -> None:
        at = time.monotonic() if at is None else at
        self.confirmed = max(self.confirmed, at)

    def unconfirmed(self) -> str | None:
        age = time.monotonic() - self.confirmed
        if age <= self.limit:
            return None
        return (
            f"this worker's group membership was last confirmed {age:.1f}s ago (more than "
            f"half the session timeout, {self.limit:g}s): it may have been evicted and its "
            "partitions given to another worker; writes wait until the group coordinator "
            "lists it again"
        )

    async def check(self) -> bool:
        """Ask once; whether the coordinator listed this member."""
        asked = time.monotonic()
        member = await self._consumer.call(lambda c: c.memberid())
        if not member:
            return False
        info = await asyncio.to_thread(describe_group, self._brokers, self._group)
        if any(m.member_id == member for m in info.members):
            self.confirm(asked)
            return True
        self.missing += 1
        return False

    async def run(self) -> None:
        """Ask every ``interval`` seconds, for ever (cancelled at the stop)."""
        while True:
            try:
                await self.check()
            except Exception as exc:  # the coordinator out of reach: unconfirmed meanwhile
                log.debug("group membership not confirmed: %s", exc)
            await asyncio.sleep(self.interval)


class Worker:
    """One worker process's runtime on librdkafka (see the module docstring)."""

    def __init__(
        self,
        bot: BotDefinition,
        provider: Provider,
        config: WorkerConfig,
        *,
        fallbacks: Mapping[str, Provider] | None = None,
    ) -> None:
        self.config = config
        cat = self.cat = config.catalog
        self._names = {
            "sent": cat.sent,
            "dlq": cat.inbound_dlq,
            "requests-dlq": cat.requests_dlq,
            "outbox-dlq": cat.outbox_dlq,
            "control-results": cat.control_results,
        }
        # the producer's transactional id is the runtime's instance id (set once bound)
        self.changelog = RdChangelog(
            worker_producer_config(config, config.instance_id or "worker"),
            cat.changelog(TABLE_NAME),
            unconfirmed=self._unconfirmed,
        )
        # the journal on Kafka (a table in RocksDB, changelogged), or a file (one worker alone)
        kv = self.kv = TableKv(self.changelog) if config.kafka_journal else None
        self.changelog.kv = kv
        letters: Counter[tuple[str, str]] = Counter()
        runtime: RuntimeLike = bot.bind(
            provider,
            kv if kv is not None else config.journal_url,
            instance_id=config.instance_id,
            receipts=KafkaReceipts(self.produce, letters),
            fallbacks=fallbacks,
        )
        self.runtime = runtime
        self.instance = str(getattr(runtime, "instance_id", config.instance_id or ""))
        self.changelog.config = worker_producer_config(config, self.instance)
        if kv is not None:
            kv.on_assigned = self._recover
            kv.on_revoking = runtime.flush_receipts
            kv.on_lost = self._lost_writes
        self.runner = InboundRunner(
            runtime,
            self.produce,
            batch_deadline=config.batch_deadline,
            owns=kv.owns if kv is not None else None,
            requests_topic=cat.requests,
            control_topic=cat.control,
            instance=self.instance,
            flush=kv.flush if kv is not None else None,
            letters=letters,
        )
        self.checkpoint = Checkpoint(self._flush, self._commit)
        self.consumer = ConsumerThread(
            worker_consumer_config(config),
            cat.inbound,
            [cat.requests, cat.control],
            self,
            batch_size=config.batch_size,
            hook_timeout=max(config.session_timeout * 4, 60.0),
        )
        self.membership = Membership(self.consumer, config)
        self._watching: asyncio.Task[None] | None = None
        self.tiers = RetryTiers(config.kafka, cat, self._owned, self._retry, self._repark)
        self._tasks: set[asyncio.Task[None]] = set()
        self._paused = False
        self._settled = asyncio.Event()
        self._stopping = asyncio.Event()
        self._started = False

    # -- what the runner and the receipts produce through -----------------------------------

    async def produce(
        self, role: str, key: bytes | None, value: bytes, headers: Headers
    ) -> asyncio.Future[int]:
        """A record of ``role`` (receipt, dead letter, control result) through the worker's
        one producer (``botmesh.streams.runner.Produce``)."""
        # a parked send goes to its journal partition's tier partition (the chat's owner)
        partition = CURRENT_PARTITION.get() if role.startswith("retry:") else None
        topic = self._names.get(role) or self.cat.retry(role.removeprefix("retry:"))
        return await self.changelog.send(topic, key, value, headers=headers, partition=partition)

    # -- the checkpoint's two steps -----------------------------------------------------------

    async def _flush(self) -> None:
        if self.kv is not None:
            await self.kv.flush()

    async def _commit(self, offsets: Mapping[TopicPart, int]) -> None:
        if self.config.exactly_once:
            metadata = await self.consumer.group_metadata()
            tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
            await self.changelog.send_offsets(tps, metadata)
            await self.changelog.commit()
        else:
            await self.consumer.commit(dict(offsets))

    # -- the consumer's rebalances (``consumer.Hooks``) ---------------------------------------

    async def assigned(self, partitions: set[int]) -> None:
        """Restore each journal partition from the changelog, open it (its recovery pass),
        then resume fetching its records (on a file journal: at once)."""
        self.membership.confirm()  # an assignment: the coordinator has this member
        if self.kv is None:
            await self.consumer.resume(partitions)
            return
        data = self.config.data_dir / "journal"
        dbs = {p: open_database(data / f"p{p}") for p in sorted(partitions)}
        done = await asyncio.to_thread(
            restore, self.config.kafka, self.changelog.topic, dbs, timeout=300.0
        )
        for p, db in dbs.items():
            self.changelog.attach(p, db)
            log.info("journal partition %d restored (%d changelog records)", p, done[p].records)
        await self.kv.assign(dbs)
        await self.consumer.resume(set(dbs))

    async def revoking(self, partitions: set[int]) -> None:
        """Settle what is in flight, checkpoint, then hand the journal partitions over."""
        await self._join()
        try:
            await self.checkpoint.run()
        except Exception as exc:  # as a crash would: their records come again
            log.warning("checkpoint before handing partitions %s over: %s", sorted(partitions), exc)
        if self.kv is not None:
            await self.kv.hand_over(partitions)
        self._drop(partitions)

    async def lost(self, partitions: set[int]) -> None:
        """Someone else's already: forget them, commit nothing."""
        self._drop(partitions)
        if self.kv is not None:
            self.kv.revoke(partitions)

    def _drop(self, partitions: set[int]) -> None:
        self.checkpoint.forget(
            (t, p)
            for t in (self.cat.inbound, self.cat.requests, self.cat.control)
            for p in partitions
        )
        for p in partitions:
            db = self.changelog.detach(p)
            if db is not None:
                db.db.close()

    async def _recover(self, partition: int) -> None:
        ops = self.runtime.durability if self._started else None
        if ops is not None:
            acted = await ops.recover()
            log.info("journal partition %d recovered (%d records acted on)", partition, acted)

    def _lost_writes(self, partition: int, exc: BaseException) -> None:
        if self._stopping.is_set():
            log.warning("journal partition %d: last writes not committed: %s", partition, exc)
            return
        _exit_hard(
            f"journal partition {partition}: writes that returned were not committed "
            f"({type(exc).__name__}: {exc})",
            EXIT_ABANDONED,
        )

    def _unconfirmed(self) -> str | None:
        return self.membership.unconfirmed()  # (the membership is made after the changelog)

    # -- the retry tiers' questions ----------------------------------------------------------

    def _owned(self) -> set[int]:
        """The partitions (inbound, journal, tiers) this worker owns now."""
        kv = self.kv
        return {p for p in self.consumer.partitions if kv is None or kv.owns(p)}

    async def _retry(self, partition: int, parked: Parked) -> str:
        """A parked send back from its retry tier, retried in its journal partition."""
        ops = self.runtime.durability
        if ops is None:
            return "stale"
        with in_partition(partition):
            return await ops.retry_parked(parked.key, parked.attempts)

    async def _repark(self, parked: Parked, tier: str) -> Any:
        """A parked send put back on its tier (acked)."""
        value = {"key": parked.key, "attempts": parked.attempts}
        value["payload"] = {"chat_id": parked.chat_id}
        tier, key, body, headers = parked_record(value, parked.retry_at)
        return await (await self.produce(f"retry:{tier}", key, body, headers))

    # -- batches ---------------------------------------------------------------------------

    def _start(self, batch: Batch) -> None:
        records = [_raw(m) for m in batch.messages]
        for r in records:
            self.checkpoint.taken(r.topic, r.partition, r.offset)
        task = asyncio.get_running_loop().create_task(self._settle(records))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle(self, records: list[RawRecord]) -> None:
        try:
            await self.runner.run_batch(records)
        except BatchAbandoned as exc:
            _exit_hard(str(exc), EXIT_ABANDONED)
        except asyncio.CancelledError:
            _exit_hard("cancelled in the middle of a batch", EXIT_SOFTWARE)
        except BaseException as exc:  # acked, it would be committed unsettled
            _exit_hard(f"{type(exc).__name__}: {exc}", EXIT_SOFTWARE)
        for r in records:
            self.checkpoint.settled(r.topic, r.partition, r.offset)
        self._settled.set()
        try:
            await self.checkpoint.run()
        except Exception as exc:  # the next checkpoint tries again
            log.warning("checkpoint failed: %s: %s", type(exc).__name__, exc)

    async def _join(self) -> None:
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    async def _pace(self) -> None:
        """At most ``in_flight`` records unsettled: beyond, fetching pauses."""
        limit = max(self.config.in_flight, 1)
        if self.checkpoint.unsettled() <= limit:
            return
        mine = set(self.consumer.partitions)
        await self.consumer.pause(mine)
        while self.checkpoint.unsettled() > limit and not self._stopping.is_set():
            self._settled.clear()
            await self._settled.wait()
        await self.consumer.resume(mine if self.kv is None else mine & self.kv.owned)

    # -- life ------------------------------------------------------------------------------

    def _provision(self) -> None:
        config = self.config
        have = existing_topics(config.kafka)
        specs = self.cat.specs_beside(have, config.partitions, config.replication)
        result = ensure_topics(config.kafka, specs)
        if result.created:
            log.info("created topics: %s", ", ".join(result.created))

    def stop(self) -> None:
        """Stop (SIGTERM): what is in flight is settled and checkpointed first."""
        self._stopping.set()

    async def run(self) -> int:
        """Run until ``stop``; the exit status."""
        if self.config.provision:
            await asyncio.to_thread(self._provision)
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        await self.changelog.start()
        if self.kv is not None:
            await self.kv.open()
        try:
            await self.runtime.start()
        except (DurabilityError, ConfigError) as exc:
            print(f"botmesh worker: cannot start the bot on its journal: {exc}", file=sys.stderr)
            return 2
        self._started = True
        await self.consumer.start()
        self._watching = asyncio.get_running_loop().create_task(self.membership.run())
        self.tiers.start()
        tid = self.changelog.config.get("transactional.id")
        log.info(
            "worker on librdkafka: %s on %s, %s%s",
            self.instance or "(no instance id)",
            self.cat.inbound,
            self.config.guarantee,
            f" (transactional producer {tid})" if tid else "",
        )
        stopping = asyncio.get_running_loop().create_task(self._stopping.wait())
        try:
            while not self._stopping.is_set():
                getting = asyncio.get_running_loop().create_task(self.consumer.batches.get())
                await asyncio.wait({getting, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not getting.done():
                    getting.cancel()
                    break
                self._start(getting.result())
                await self._pace()
        finally:
            stopping.cancel()
            await self._shutdown()
        return 0

    async def _shutdown(self) -> None:
        await self.tiers.stop()
        if self._watching is not None:
            self._watching.cancel()
        await self._join()
        try:
            await self.checkpoint.run()
        except Exception as exc:
            log.warning("last checkpoint failed: %s", exc)
        try:
            await self.runtime.quiesce()
        except Exception as exc:
            log.warning("receipts not recorded as published before the stop: %s", exc)
        try:
            if self.kv is not None:
                await self.kv.flush(commit=True)
        except Exception as exc:
            log.warning("deferred journal writes not flushed at the stop: %s", exc)
        try:
            await self.checkpoint.run()
        except Exception as exc:
            log.warning("last checkpoint failed: %s", exc)
        await self.consumer.close()
        await self.runtime.stop()
        if self.kv is not None:
            await self.kv.close()
        await self.changelog.stop()


def run_worker(
    bot: BotDefinition,
    provider: Provider,
    config: WorkerConfig,
    *,
    fallbacks: Mapping[str, Provider] | None = None,
) -> int:
    """Run a worker on librdkafka until SIGTERM / Ctrl-C; the exit status."""

    async def main() -> int:
        worker = Worker(bot, provider, config, fallbacks=fallbacks)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        return await worker.run()

    return asyncio.run(main())
