"""The worker's loop on librdkafka: its one consumer, its one producer, its journal, and the
batches between them.

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
without acking it (``os._exit``: 75, or 70 for anything else): the broker hands the batch
to the next owner, and the journal answers what was settled.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from confluent_kafka import KafkaError, Message, TopicPartition

from botmesh.observability.http import HealthServer
from botmesh.observability.metrics import WorkerSources, WorkerTelemetry
from botmesh.state.errors import ConfigError, DurabilityError
from botmesh.state.keys import is_turn_key, record_group
from botmesh.state.ports import Provider
from botmesh.streams.clients import wait_topic
from botmesh.streams.config import WorkerConfig, group_instance_id
from botmesh.streams.groups import describe
from botmesh.streams.membership import (
    AssignmentWatch,
    ClientCalls,
    TopicsNotListed,
    wait_for_topics,
)
from botmesh.streams.provision import (
    admin_client,
    check_copartitioned,
    ensure_topics,
    existing_topics,
)
from botmesh.streams.retry_tiers import Parked, RetryTiers, parked_record
from botmesh.streams.runner import (
    BatchAbandoned,
    BotDefinition,
    InboundRunner,
    RawRecord,
    RecordScope,
    RuntimeLike,
)
from botmesh.streams.sink import Headers, KafkaReceipts
from botmesh.streams.table_kv import CURRENT_PARTITION, TABLE_NAME, TableKv, in_partition
from botmesh.streams.worker.changelog import FENCED_CODES, RdChangelog, lost_transaction
from botmesh.streams.worker.checkpoint import Checkpoint, TopicPart
from botmesh.streams.worker.clients import worker_consumer_config, worker_producer_config
from botmesh.streams.worker.consumer import Batch, ConsumerThread
from botmesh.streams.worker.observe import Observed
from botmesh.streams.worker.restore import open_database, restore
from botmesh.topics.catalog import Catalog
from botmesh.topics.dead_letters import redact

__all__ = [
    "EXIT_ABANDONED",
    "EXIT_CONFIG",
    "EXIT_SOFTWARE",
    "Worker",
    "current_records",
    "producer_failure",
    "run_worker",
]

log = logging.getLogger("botmesh.streams")

EXIT_CONFIG = 2  # as the command line's refusals: the operator's to fix
EXIT_ABANDONED = 75  # EX_TEMPFAIL: a batch given up, start again
EXIT_SOFTWARE = 70

#: Seconds a restore of the journal partitions given in one rebalance may take (past it,
#: the worker exits 75 and starts afresh rather than hold partitions it cannot serve).
RESTORE_S = 300.0
#: Seconds to wait for an inbound partition's end when it is given.
FRESH_ASK_S = 10.0


def producer_failure(err: KafkaError) -> str:
    """Why the worker exits when its one producer failed for good, in words an operator
    reads on its last line: fenced by a newer epoch, or the transaction it held over a
    freeze aborted by the coordinator (``INVALID_TXN_STATE``), or another fatal error."""
    if err.code() in FENCED_CODES:
        why = (
            "fenced by a newer producer epoch (its transaction timed out while this worker "
            "was away, or another incarnation started)"
        )
    else:
        why = f"failed: {lost_transaction(err)}".rstrip(": ")
    return f"the producer {why}: {err.name()}: {err.str()}"


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


def current_records(batch: Batch, serving: Mapping[int, int]) -> list[RawRecord]:
    """The records of ``batch`` whose partition this worker serves, fetched since it was
    given (``serving``: partition -> the consumer epoch of its assignment). A batch fetched
    before a partition was taken away, or taken and given again, can reach the loop after
    the hook: its records of that partition are the new owner's, or come again from the
    committed offset."""
    epoch = batch.epoch
    return [
        _raw(m)
        for m in batch.messages
        if serving.get(m.partition() or 0, epoch + 1) <= epoch  # (a consumed record has one)
    ]


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


#: Membership questions a session timeout (``Membership``): the writes' limit is half of
#: it, so three in a row must fail before a healthy worker's write is refused.
CHECKS_A_SESSION = 8
#: Membership questions waiting for their answer at once, at most.
MAX_ASKING = 3
#: Admin clients a membership keeps after replacing them (``Membership.client``), at
#: most one a session timeout apart: the oldest goes once this many are kept.
RETIRED_CLIENTS = 8


class Membership:
    """Fenced by the group: when this worker's membership was last confirmed.

    Under ``at_least_once`` nothing on the broker stops a worker that lost its partitions
    from producing to their changelog, and a worker thawed after a freeze (``SIGSTOP``, a
    long pause) past the session timeout does not know yet that it was evicted. librdkafka
    keeps its heartbeats to itself, so this asks the group coordinator: every eighth of the
    session timeout, a describe of the group that lists this consumer's member id confirms
    the membership as of the moment the question was sent (an assignment confirms it too).
    A journal write is refused while the last confirmation is older than half the session
    timeout (``unconfirmed``): the coordinator evicts a member only a whole session timeout
    after its last heartbeat, so a write that passed leaves at least half of it before
    another worker can own the partition.

    A healthy worker must never be refused: three questions in a row must go unanswered
    before the last confirmation is that old, and each question runs in a task of its own,
    so one the coordinator is slow to answer (up to its 10 s limit) does not hold up the
    next. (Asked every quarter, one question that failed was enough: the next confirmation
    came just past the limit, and the writes of that moment were refused; a claim refused
    after its ack leaves its send in flight, resolved by the ambiguity policy.) A question
    that fails is said at info, once in a row of failures."""

    def __init__(self, consumer: ConsumerThread, config: WorkerConfig) -> None:
        self._consumer = consumer
        self._brokers = config.kafka
        self._group = config.catalog.group
        self.limit = config.session_timeout / 2
        self.interval = config.session_timeout / CHECKS_A_SESSION
        self.confirmed = time.monotonic()
        #: Questions the coordinator answered without this member (it was evicted).
        self.missing = 0
        #: Questions that got no answer (an error, the time limit), and in a row now.
        self.failed = 0
        self._failing = 0
        self._admin: Any = None
        self._made_at = 0.0
        self._session = config.session_timeout
        #: Clients replaced (``client``), kept rather than destroyed while a request of
        #: theirs may still be pending in librdkafka.
        self.retired: deque[Any] = deque(maxlen=RETIRED_CLIENTS)
        #: Its calls on that client (settled at the stop: ``ClientCalls``).
        self.calls = ClientCalls()

    def confirm(self, at: float | None = None) -> None:
        at = time.monotonic() if at is None else at
        self.confirmed = max(self.confirmed, at)

    def unconfirmed(self, at: float | None = None) -> str | None:
        """Why the membership is not confirmed as of ``at`` (``time.monotonic()``; now by
        default), else ``None``."""
        age = (time.monotonic() if at is None else at) - self.confirmed
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
        member = self._consumer.member_id
        if not member:
            log.debug("group membership not asked about: no member id yet")
            return False
        admin = await self.client()
        info = await self.calls.call(describe, admin, self._group, self._brokers, 10.0)
        if any(m.member_id == member for m in info.members):
            self.confirm(asked)
            return True
        self.missing += 1
        log.info(
            "the group coordinator does not list this consumer (%s) in group %s (%s, %d members)",
            member,
            self._group,
            info.state,
            len(info.members),
        )
        return False

    async def client(self) -> Any:
        """The admin client the questions ask with: one for a long time, since a client
        dropped with a request of it still pending can trip librdkafka (a refcount
        assertion). But once the questions have failed for a whole session timeout, and
        the client is that old, the next ones ask with a new client: after a broker's
        restart under load, CI saw one client's questions fail for minutes while the
        coordinator held this member, and every journal write was refused meanwhile. The
        client replaced is kept (``retired``) until its requests are long over."""
        now = time.monotonic()
        if (
            self._admin is not None
            and self._failing >= CHECKS_A_SESSION
            and now - self._made_at >= self._session
        ):
            log.info(
                "group membership questions failed for a session timeout (%d in a row): "
                "asking with a new admin client",
                self._failing,
            )
            self.retired.append(self._admin)
            self._admin = None
        if self._admin is None:
            self._admin = await self.calls.call(admin_client, self._brokers)
            self._made_at = now
        return self._admin

    async def run(self) -> None:
        """Ask every ``interval`` seconds, each question in a task of its own (at most
        ``MAX_ASKING`` at once), for ever (cancelled at the stop)."""
        asking: set[asyncio.Task[None]] = set()
        try:
            while True:
                if len(asking) < MAX_ASKING:
                    task = asyncio.ensure_future(self._ask())
                    asking.add(task)
                    task.add_done_callback(asking.discard)
                await asyncio.sleep(self.interval)
        finally:
            for task in asking:
                task.cancel()

    async def _ask(self) -> None:
        began = time.monotonic()
        try:
            await self.check()
        except Exception as exc:  # the coordinator out of reach: unconfirmed meanwhile
            self.failed += 1
            self._failing += 1
            (log.info if self._failing % CHECKS_A_SESSION == 1 else log.debug)(
                "group membership not confirmed (%s after %.1fs: %s); last confirmed %.1fs ago",
                type(exc).__name__,
                time.monotonic() - began,
                exc,
                time.monotonic() - self.confirmed,
            )
            return
        if self._failing:
            log.info("group membership confirmed again, after %d questions failed", self._failing)
            self._failing = 0


class Worker:
    """One worker process's runtime on librdkafka (see the module docstring)."""

    def __init__(
        self,
        bot: BotDefinition,
        provider: Provider,
        config: WorkerConfig,
        *,
        fallbacks: Mapping[str, Provider] | None = None,
        record_scope: RecordScope | None = None,
        journal_written: Callable[[float], None] | None = None,
    ) -> None:
        self.config = config
        cat = self.cat = config.catalog
        self._names = _role_topics(cat)
        self.changelog, self.kv = self._journal()
        kv = self.kv
        letters: Counter[tuple[str, str]] = Counter()
        telemetry = WorkerTelemetry(WorkerSources())
        # the histograms are fed only when /metrics is served (BOTMESH_HTTP_PORT)
        timed = telemetry if config.http_port is not None else None
        runtime = self.runtime = self._bind(bot, provider, letters, timed, fallbacks)
        self.instance = str(getattr(runtime, "instance_id", config.instance_id or ""))
        self.changelog.config = worker_producer_config(config, self.instance)
        if kv is not None:
            kv.on_assigned = self._recover
            kv.on_revoking = runtime.flush_receipts
            kv.on_lost = self._lost_writes
            kv.write_seconds = _both(timed.journal_write if timed else None, journal_written)
        self.runner = self._inbound_runner(letters, timed)
        if record_scope is not None:
            self.runner.scope = record_scope
        self.checkpoint = Checkpoint(self._flush, self._commit)
        self.consumer = self._consumer_thread()
        self.changelog.writer(self.instance, -1)
        self.changelog.on_fatal = self._producer_failed
        self.membership = Membership(self.consumer, config)
        self.watch = self._assignment_watch()
        #: Journal partitions being restored from the changelog now (``/readyz``).
        self.restoring: set[int] = set()
        #: partition -> the consumer epoch from which its records are started (``_serve``)
        self._serving: dict[int, int] = {}
        #: Each inbound partition's offset from which its records are fresh (its end when
        #: it was given to this worker).
        self._fresh_at: dict[int, int] = {}
        #: Partitions of the inbound topic (read at the start; the rate limit's share).
        self._inbound_count = config.partitions
        self.observed = Observed(self)
        telemetry.sources = self.observed.sources()
        self.http = self._health_server(telemetry)
        self._background: list[asyncio.Task[None]] = []
        self._watching: asyncio.Task[None] | None = None
        self.tiers = RetryTiers(config.kafka, cat, self._owned, self._retry, self._repark)
        self._tasks: set[asyncio.Task[None]] = set()
        self._paused = False
        self._settled = asyncio.Event()
        self._stopping = asyncio.Event()
        self.started = False

    # -- the parts the constructor builds -------------------------------------------------

    def _journal(self) -> tuple[RdChangelog, TableKv | None]:
        """The worker's producer (the journal's changelog goes through it), and the journal
        on Kafka over it (a table in RocksDB, changelogged); ``None`` for a journal in a
        file (one worker alone)."""
        config = self.config
        # the producer's transactional id is the runtime's instance id (set once bound)
        changelog = RdChangelog(
            worker_producer_config(config, config.instance_id or "worker"),
            self.cat.changelog(TABLE_NAME),
            unconfirmed=self._unconfirmed,
        )
        kv = (
            TableKv(changelog, volatile=is_turn_key, group=record_group)
            if config.kafka_journal
            else None
        )
        changelog.kv = kv
        return changelog, kv

    def _bind(
        self,
        bot: BotDefinition,
        provider: Provider,
        letters: Counter[tuple[str, str]],
        timed: WorkerTelemetry | None,
        fallbacks: Mapping[str, Provider] | None,
    ) -> RuntimeLike:
        """``bot`` bound to this worker's journal, its receipts and dead letters produced
        through the worker's producer (under ``exactly_once``, riding with the journal's
        writes)."""
        kv, config = self.kv, self.config
        return bot.bind(
            provider,
            kv if kv is not None else config.journal_url,
            instance_id=config.instance_id,
            receipts=KafkaReceipts(
                self.produce,
                letters,
                ride_with=kv.ride if kv is not None and config.exactly_once else None,
            ),
            timings=timed,
            fallbacks=fallbacks,
            rate_limits=config.rate_limits,
        )

    def _inbound_runner(
        self, letters: Counter[tuple[str, str]], timed: WorkerTelemetry | None
    ) -> InboundRunner:
        """The runner that settles the records of the inbound, requests and control topics
        through the bound bot."""
        kv = self.kv
        return InboundRunner(
            self.runtime,
            self.produce,
            batch_deadline=self.config.batch_deadline,
            owns=kv.owns if kv is not None else None,
            requests_topic=self.cat.requests,
            control_topic=self.cat.control,
            statuses_topic=self.cat.statuses,
            instance=self.instance,
            flush=kv.flush if kv is not None else None,
            on_settled=timed.settled if timed is not None else None,
            letters=letters,
            fresh=self._fresh if kv is not None else None,
        )

    def _consumer_thread(self) -> ConsumerThread:
        """The worker's one consumer: the inbound, with the requests and control topics."""
        cat = self.cat
        return ConsumerThread(
            worker_consumer_config(self.config),
            cat.inbound,
            [cat.requests, cat.control, cat.statuses],
            self,
            batch_size=self.config.batch_size,
            hook_timeout=RESTORE_S + 60.0,  # a restore's own limit comes first
            on_generation=self._generation,
        )

    def _health_server(self, telemetry: WorkerTelemetry) -> HealthServer | None:
        """The HTTP server of ``/healthz``, ``/readyz`` and ``/metrics``, when a port is set
        (``BOTMESH_HTTP_PORT``)."""
        config = self.config
        if config.http_port is None:
            return None
        return HealthServer(
            config.http_host, config.http_port, self.observed.readiness, telemetry.scrape
        )

    def _assignment_watch(self) -> AssignmentWatch:
        """What checks, while this worker owns no inbound partition, that the group leaves
        none without an owner."""
        config = self.config
        instance_id = config.instance_id or ""
        return AssignmentWatch(
            bootstrap=config.kafka,
            group=self.cat.group,
            topic=self.cat.inbound,
            owned=lambda: set(self.consumer.partitions),
            instance_id=None if config.instance_id is None else group_instance_id(instance_id),
            member_id=lambda: self.consumer.member_id or None,
            rebalancing=lambda: self.consumer.rebalancing,
        )

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    # -- what the runner and the receipts produce through -----------------------------------

    async def produce(
        self, role: str, key: bytes | None, value: bytes, headers: Headers
    ) -> asyncio.Future[int]:
        """A record of ``role`` (receipt, dead letter, control result) through the worker's
        one producer (``botmesh.streams.sink.Produce``)."""
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
        self._reshare(set(self.consumer.partitions) | partitions)
        epoch = self.consumer.epoch  # of this assignment: its records are fetched from now on
        if self.kv is None:
            self._serve(partitions, epoch)
            await self.consumer.resume(partitions)
            return
        await self._fresh_from_now_on(partitions)
        data = self.config.data_dir / "journal"
        dbs = {p: open_database(data / f"p{p}") for p in sorted(partitions)}
        self.restoring |= set(dbs)
        began = time.monotonic()
        try:
            done = await asyncio.to_thread(
                restore, self.config.kafka, self.changelog.topic, dbs, timeout=RESTORE_S
            )
        except Exception as exc:  # partitions held, never served: start afresh instead
            _exit_hard(f"journal partitions {sorted(dbs)} not restored: {exc}", EXIT_ABANDONED)
        finally:
            self.restoring -= set(dbs)
        took = time.monotonic() - began
        for p, db in dbs.items():
            self.changelog.attach(p, db)
            r = done[p]
            log.info(
                "journal partition %d restored: %d changelog records read from offset %d to %d "
                "in %.1f s",
                p,
                r.records,
                r.start,
                r.end,
                took,
            )
        # a restore can outlast the membership's last confirmation: asked again before the
        # recovery pass writes
        if not await self._confirmed():
            log.warning("membership not confirmed after the restore: writes wait for it")
        await self.kv.assign(dbs)
        self._serve(set(dbs), epoch)
        await self.consumer.resume(set(dbs))

    async def _fresh_from_now_on(self, partitions: set[int]) -> None:
        """Each given inbound partition's end now: its records from there on are fresh
        (``DEFERRED_WHEN_FRESH``: never in flight at an earlier crash, so their journal
        record need not be durable before their handlers run). Not known (the broker did
        not answer): none of the partition's records is."""
        topic = self.cat.inbound

        def ends(consumer: Any) -> dict[int, int]:
            return {
                p: consumer.get_watermark_offsets(
                    TopicPartition(topic, p), timeout=FRESH_ASK_S, cached=False
                )[1]
                for p in sorted(partitions)
            }

        for p in partitions:
            self._fresh_at.pop(p, None)
        try:
            self._fresh_at.update(await self.consumer.call(ends))
        except Exception as exc:
            log.warning(
                "the ends of inbound partitions %s not read (%s: %s): each inbound journaled "
                "before its handlers run",
                sorted(partitions),
                type(exc).__name__,
                exc,
            )

    def _fresh(self, raw: RawRecord) -> bool:
        at = self._fresh_at.get(raw.partition)
        return at is not None and raw.topic == self.cat.inbound and raw.offset >= at

    async def revoking(self, partitions: set[int]) -> None:
        """Settle what is in flight, checkpoint, then hand the journal partitions over."""
        self._unserve(partitions)
        self._reshare(set(self.consumer.partitions) - partitions)
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
        self._unserve(partitions)
        self._reshare(set(self.consumer.partitions) - partitions)
        self._drop(partitions)
        if self.kv is not None:
            self.kv.revoke(partitions)

    def _reshare(self, owned: set[int]) -> None:
        """This worker's part of the channel's rate limit: the part of the inbound
        partitions it owns (``owned``), so that the group's workers stay under the limit
        together (one that owns none keeps one partition's part)."""
        total = max(self._inbound_count, len(owned), 1)
        share = max(len(owned), 1) / total
        set_share = getattr(self.runtime, "set_pace_share", None)
        if set_share is not None:
            set_share(share)
            log.debug("rate limit share %.3f (%d of %d partitions)", share, len(owned), total)

    def _serve(self, partitions: set[int], epoch: int) -> None:
        """Records of ``partitions`` fetched from ``epoch`` on are started (``_start``)."""
        for p in partitions:
            self._serving[p] = epoch

    def _unserve(self, partitions: set[int]) -> None:
        """No more records of ``partitions`` are started: a batch fetched before they were
        taken away (queued, or taken off the queue as the hook ran) would find its journal
        partition gone and end the worker; the new owner reads them from the committed
        offsets."""
        for p in partitions:
            self._serving.pop(p, None)

    def _drop(self, partitions: set[int]) -> None:
        for p in partitions:
            self._fresh_at.pop(p, None)
        self.checkpoint.forget(
            (t, p)
            for t in (self.cat.inbound, self.cat.requests, self.cat.control, self.cat.statuses)
            for p in partitions
        )
        for p in partitions:
            db = self.changelog.detach(p)
            if db is not None:
                db.db.close()

    async def _recover(self, partition: int) -> None:
        ops = self.runtime.durability if self.started else None
        if ops is not None:
            acted = await ops.recover()
            log.info("journal partition %d recovered (%d records acted on)", partition, acted)

    def _lost_writes(self, partition: int, exc: BaseException) -> None:
        if self._stopping.is_set():
            log.warning("journal partition %d: last writes not committed: %s", partition, exc)
            return
        if self.kv is not None and not self.kv.owns(partition):
            # handed over meanwhile: dropped from memory, its new owner restores without them
            log.info("journal partition %d: revoked with its last writes uncommitted", partition)
            return
        _exit_hard(
            f"journal partition {partition}: writes that returned were not committed "
            f"({type(exc).__name__}: {exc})",
            EXIT_ABANDONED,
        )

    def _producer_failed(self, err: KafkaError) -> None:
        """The one producer failed for good (fenced by a newer one, its transaction timed
        out while this worker was frozen, a fatal error): nothing can be journaled or
        committed any more; start afresh, unacked, unless stopping anyway."""
        if self._stopping.is_set():
            log.warning("the producer failed during the stop: %s", err.str())
            return
        _exit_hard(producer_failure(err), EXIT_ABANDONED)

    async def _confirmed(self) -> bool:
        try:
            return await self.membership.check()
        except Exception as exc:  # the coordinator out of reach: the watch asks again
            log.debug("group membership not confirmed: %s", exc)
            return False

    def _generation(self, generation: int) -> None:
        """A rebalance ended with this member in generation ``generation`` (the consumer's
        thread): the coordinator had it then; its records say so from now on."""
        self.membership.confirm()
        self.changelog.writer(self.instance, generation)

    def _unconfirmed(self, at: float | None = None) -> str | None:
        return self.membership.unconfirmed(at)  # (the membership is made after the changelog)

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
        records = current_records(batch, self._serving)
        if len(records) < len(batch.messages):  # fetched before a hand-over: the owner's now
            dropped = len(batch.messages) - len(records)
            log.debug("%d records of partitions taken away since their fetch dropped", dropped)
        if not records:
            return
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
        made = {s.name: s.partitions for s in specs if s.name in result.created}
        check_copartitioned(self.cat, {**have, **made})

    def stop(self) -> None:
        """Stop (SIGTERM): what is in flight is settled and checkpointed first."""
        self._stopping.set()

    async def run(self) -> int:
        """Run until ``stop``; the exit status."""
        if self.http is not None:  # first: a probe sees every step of the start
            try:
                await self.http.start()
            except OSError as exc:
                return _refused(str(exc))
        try:
            return await self._run()
        finally:
            if self.http is not None:  # last: /readyz says "stopping" until then
                await self.http.stop()

    async def _run(self) -> int:
        config = self.config
        if config.provision:
            try:
                await asyncio.to_thread(self._provision)
            except ConfigError as exc:
                return _refused(str(exc))
        try:
            config.data_dir.mkdir(parents=True, exist_ok=True)
            await self.changelog.start()
            if self.kv is not None:
                await self.kv.open()
            await self.runtime.start()
        except (DurabilityError, ConfigError) as exc:
            return _refused(f"cannot start the bot on its journal: {exc}")
        self.started = True
        log.info("runtime started: %s", self._about())
        try:
            await wait_for_topics(
                config.kafka, [self.cat.inbound, *self.consumer.side], config.topic_wait
            )
        except (TopicsNotListed, ConnectionError) as exc:
            await self.runtime.stop()
            await self.changelog.stop()
            return _refused(str(exc))
        await self._count_inbound()
        await self.consumer.start()
        loop = asyncio.get_running_loop()
        self._watching = loop.create_task(self.membership.run())
        self._background = [
            loop.create_task(self.watch.run()),
            loop.create_task(
                self.observed.publish_every(config.metrics_interval, lambda: self.stopping)
            ),
        ]
        self.tiers.start()
        tid = self.changelog.config.get("transactional.id")
        log.info(
            "worker started: %s on %s, %s%s",
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
        # a batch still retrying is given up (exit 75, unacked): the next owner takes it
        self.runner.stopping.set()
        await self.tiers.stop()
        for task in self._background:
            task.cancel()
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
        await self.observed.publish()  # the last counters, while the producer runs
        await self.consumer.close()
        if self._watching is not None:
            self._watching.cancel()
        # the group questions still under way end before their clients can go
        for calls in (self.membership.calls, self.watch.calls):
            await calls.settle(15.0)
        await self.runtime.stop()
        if self.kv is not None:
            await self.kv.close()
        await self.changelog.stop()

    async def _count_inbound(self) -> None:
        """How many partitions the inbound topic has (the rate limit's share); not read
        (the broker did not answer): ``BOTMESH_PARTITIONS``."""
        try:
            parts = await asyncio.to_thread(wait_topic, self.config.kafka, self.cat.inbound, 5.0)
        except Exception as exc:
            log.warning(
                "partitions of %s not read (%s): taken as %d",
                self.cat.inbound,
                exc,
                self._inbound_count,
            )
            return
        if parts:
            self._inbound_count = len(parts)

    def _about(self) -> str:
        config, cat = self.config, self.cat
        kv = f" ({self.changelog.topic})" if self.kv is not None else ""
        return (
            f"bot on {cat.inbound}, {cat.requests}, {cat.control} and {cat.statuses}, journal "
            f"{redact(config.journal_url)}{kv}, instance {self.instance or '(default)'}, "
            f"Kafka at {config.bootstrap} ({config.security.describe()})"
        )


def run_worker(
    bot: BotDefinition,
    provider: Provider,
    config: WorkerConfig,
    *,
    fallbacks: Mapping[str, Provider] | None = None,
    record_scope: RecordScope | None = None,
    journal_written: Callable[[float], None] | None = None,
) -> int:
    """Run a worker on librdkafka until SIGTERM / Ctrl-C; the exit status.

    What the command line brings (``botmesh.observability.logs`` and ``.tracing``: this
    package imports neither): ``record_scope``, what the runner settles each record inside
    (its log context and span); ``journal_written``, told the seconds of each awaited
    journal write (its span). A stop still under way ``config.stop_timeout`` seconds after
    the first signal ends with the process (``_stop_overdue``)."""

    async def main() -> int:
        worker = Worker(
            bot,
            provider,
            config,
            fallbacks=fallbacks,
            record_scope=record_scope,
            journal_written=journal_written,
        )
        loop = asyncio.get_running_loop()
        timer: list[threading.Timer] = []

        def stop() -> None:
            if not timer:  # the first signal: the stop starts, and its limit with it
                limit = config.stop_timeout
                timer.append(threading.Timer(limit, _stop_overdue, (limit,)))
                timer[0].daemon = True
                timer[0].start()
            worker.stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop)
        try:
            return await worker.run()
        finally:
            for t in timer:
                t.cancel()

    return asyncio.run(main())


def _refused(why: str) -> int:
    """The operator's to fix (a journal that cannot be opened, topics not listed, a port
    taken): one line, no traceback."""
    log.error("%s", why)
    print(f"botmesh worker: {why}", file=sys.stderr)
    return EXIT_CONFIG


def _stop_overdue(limit: float) -> None:
    """A stop that outlasted its limit (a provider call that hangs, a server that waits on
    its clients): the stacks of every thread go to stderr, then the process exits without
    acking; what was not committed is redelivered and the journal answers the duplicates."""
    log.critical("the worker did not stop within %gs (BOTMESH_STOP_TIMEOUT); its threads:", limit)
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    _exit_hard(f"the stop took longer than {limit:g}s", EXIT_SOFTWARE)


def _role_topics(cat: Catalog) -> dict[str, str]:
    """The topic of each role the worker produces to (``Worker.produce``), but the retry
    tiers'."""
    return {
        "sent": cat.sent,
        "dlq": cat.inbound_dlq,
        "requests-dlq": cat.requests_dlq,
        "outbox-dlq": cat.outbox_dlq,
        "control-results": cat.control_results,
    }


def _both(
    first: Callable[[float], None] | None, then: Callable[[float], None] | None
) -> Callable[[float], None] | None:
    """Both callbacks (either may be absent)."""
    if first is None or then is None:
        return first or then

    def both(seconds: float) -> None:
        first(seconds)
        then(seconds)

    return both
