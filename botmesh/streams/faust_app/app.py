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
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NoReturn

import faust

from botmesh.observability.http import HealthServer, Readiness
from botmesh.observability.metrics import WorkerSources, WorkerTelemetry
from botmesh.state.backoff import RETRY_TIERS
from botmesh.state.errors import ConfigError, DurabilityError
from botmesh.state.kv import DurableKv
from botmesh.state.ports import Provider
from botmesh.streams.config import WorkerConfig, group_instance_id
from botmesh.streams.connection import Brokers, settings_of
from botmesh.streams.faust_app.defects import install as install_workarounds
from botmesh.streams.faust_app.table import JOURNAL_ROCKSDB, JournalTable
from botmesh.streams.membership import AssignmentWatch, TopicsNotListed, wait_for_topics
from botmesh.streams.provision import ensure_topics, existing_topics
from botmesh.streams.retry_tiers import Parked, RetryTiers, parked_record
from botmesh.streams.runner import (
    BatchAbandoned,
    BotDefinition,
    Headers,
    InboundRunner,
    KafkaReceipts,
    RawRecord,
    RecordScope,
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
from botmesh.topics.metrics import metrics_record

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
    #: the journal on Kafka (closed after the runtime: its deferred writes flushed)
    botmesh_journal: TableKv | None = None
    botmesh_about = ""
    #: publishes the counters once more at a clean stop (``build_app``)
    botmesh_last_metrics: Callable[[], Awaitable[None]] | None = None
    #: the readiness and the empty-assignment check (``botmesh.streams.membership``)
    botmesh_watch: AssignmentWatch | None = None
    botmesh_kafka: Brokers = ""
    #: seconds the join waits for the broker to list the subscribed topics
    botmesh_topic_wait = 60.0
    #: ``/healthz``, ``/readyz`` and ``/metrics`` (``BOTMESH_HTTP_PORT``), or None
    botmesh_http: HealthServer | None = None
    _runtime_started = False
    _watching: Any = None

    async def on_start(self) -> None:
        if self.botmesh_http is not None:  # first: a probe sees every step of the start
            try:
                await self.botmesh_http.start()
            except OSError as exc:
                _exit_at_start(str(exc))
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
        if self.botmesh_runtime is not None and self._runtime_started:
            # the sweeper stopped and the receipts recorded published while the partitions
            # are ours: the consumer's stop hands them over, and a write after that (a
            # receipt's published mark, a send the sweeper settles) would be refused
            try:
                await self.botmesh_runtime.quiesce()
            except Exception as exc:  # as a crash here would: the next start publishes them
                log.warning("receipts not recorded as published before the stop: %s", exc)
        if self.botmesh_journal is not None:  # while the producer and RocksDB are still up
            try:
                await self.botmesh_journal.flush(commit=True)
            except Exception as exc:  # as a crash here would: their records come again
                log.warning("deferred journal writes not flushed at the stop: %s", exc)
        await super().on_stop()  # stops the consumer, waiting for the batch in progress
        if self.botmesh_last_metrics is not None:
            await self.botmesh_last_metrics()
        await self._stop_runtime()

    async def on_shutdown(self) -> None:
        await super().on_shutdown()
        await self._stop_runtime()
        if self.botmesh_http is not None:  # last: /readyz says "stopping" until then
            await self.botmesh_http.stop()

    async def _stop_runtime(self) -> None:
        if self.botmesh_runtime is not None and self._runtime_started:
            self._runtime_started = False
            await self.botmesh_runtime.stop()
            if self.botmesh_journal is not None:  # its last deferred writes (receipts published)
                await self.botmesh_journal.close()


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


def build_app(
    bot: BotDefinition,
    provider: Provider,
    config: WorkerConfig,
    *,
    fallbacks: Mapping[str, Provider] | None = None,
) -> Any:
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
    telemetry = WorkerTelemetry(WorkerSources())
    # the histograms are fed only when /metrics is served (BOTMESH_HTTP_PORT)
    timed = telemetry if config.http_port is not None else None
    letters: Counter[tuple[str, str]] = Counter()  # dead letters by kind and reason
    runtime = wiring.runtime = bot.bind(
        provider,
        journal,
        instance_id=config.instance_id,
        receipts=KafkaReceipts(wiring.produce, letters),
        timings=timed,
        fallbacks=fallbacks,
    )
    instance = str(getattr(runtime, "instance_id", config.instance_id or ""))
    kv = wiring.kv
    if kv is not None:
        assert wiring.table is not None
        wiring.table.writer_id = instance
        kv.on_assigned = wiring.recover
        kv.on_revoking = runtime.flush_receipts  # receipts recorded while the chats are ours
        kv.on_lost = wiring.lost
        kv.write_seconds = timed.journal_write if timed is not None else None
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
        on_settled=timed.settled if timed is not None else None,
        letters=letters,
    )
    app.botmesh_runtime = runtime
    app.botmesh_journal = kv
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
    telemetry.sources = wiring.sources()
    if config.http_port is not None:
        app.botmesh_http = HealthServer(
            config.http_host, config.http_port, wiring.readiness, telemetry.scrape
        )
    app.agent(inbound, name=f"{cat.app_id}.inbound", concurrency=1)(wiring.process)
    _publish_metrics(app, runtime, cat.metrics, config, wiring)
    app.botmesh_about = (
        f"bot {bot.bot_id} on {cat.inbound}, {cat.requests} and {cat.control}, "
        f"journal {redact(config.journal_url)}"
        f"{' (' + cat.changelog(TABLE_NAME) + ')' if kv is not None else ''}, "
        f"instance {config.instance_id or '(the runtime default)'}, provider {provider.name}, "
        f"Kafka at {config.bootstrap} ({config.security.describe()})"
    )
    return app


def faust_options(brokers: Brokers) -> dict[str, Any]:
    """Keywords of ``faust.App``: the broker URLs and their credentials."""
    s = settings_of(brokers)
    sec = s.security
    out: dict[str, Any] = {
        "broker": [f"kafka://{b.strip()}" for b in s.bootstrap.split(",") if b.strip()]
    }
    if sec.sasl:
        assert sec.sasl_password is not None
        out["broker_credentials"] = faust.SASLCredentials(
            username=sec.sasl_username,
            password=sec.sasl_password.reveal(),
            ssl_context=sec.ssl_context,
            mechanism=sec.sasl_mechanism,
        )
    elif sec.tls:
        assert sec.ssl_context is not None
        out["broker_credentials"] = faust.SSLCredentials(sec.ssl_context)
    return out


def _new_app(config: WorkerConfig) -> Any:
    """The Faust app with the worker's settings (no agent, no table yet)."""
    # Faust's web server stays off: the worker serves its own (``HealthServer``)
    web: dict[str, Any] = {"web_enabled": False}
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

    # -- what operators see (``botmesh.observability``) --------------------------------------

    def readiness(self) -> Readiness:
        """``/readyz``: ready once the worker is in the group and owns its inbound partitions
        with their journal partitions restored and recovered; else why not."""
        app, cat = self.app, self.cat
        runner = getattr(self, "runner", None)
        if runner is not None and runner.stopping.is_set():
            return Readiness(False, "stopping")
        if not app._runtime_started:
            return Readiness(False, "starting: the bot's runtime is not started yet")
        if app.rebalancing:
            return Readiness(False, "the group is rebalancing")
        restoring = self.restoring()
        if restoring or app.in_recovery:
            return Readiness(False, f"restoring {restoring} journal partitions from the changelog")
        watch: AssignmentWatch | None = app.botmesh_watch
        if watch is None or not watch.ready:
            return Readiness(False, f"joining the group: owns no partition of {cat.inbound} yet")
        mine = self.inbound_assigned()
        kv = self.kv
        if kv is not None:
            closed = sorted(p for p in mine if not kv.owns(p))
            if closed:
                return Readiness(False, f"journal partitions {closed} not open yet")
            recovering = sorted(kv.recovering & mine)
            if recovering:
                return Readiness(False, f"recovering journal partitions {recovering}")
        if self.table is not None:
            stale = self.table.unconfirmed()
            if stale is not None:
                return Readiness(False, stale)
        if not mine:
            return Readiness(
                True, f"idle: the group's other members own every partition of {cat.inbound}"
            )
        return Readiness(True, f"owns partitions {sorted(mine)} of {cat.inbound}")

    def restoring(self) -> int:
        """Journal partitions Faust is restoring from the changelog now."""
        app = self.app
        if not app.in_recovery:
            return 0
        try:
            remaining = app.tables.recovery.active_remaining()
        except Exception:  # not started yet
            return 0
        return sum(1 for n in remaining.values() if n > 0)

    def lag(self) -> dict[tuple[str, int], int]:
        """Records between each consumed partition's committed offset and its end."""
        try:
            consumer: Any = self.app.consumer
            tps = consumer.assignment()
        except Exception:  # not started yet
            return {}
        topics = {self.cat.inbound, self.cat.requests, self.cat.control}
        committed = consumer._committed_offset
        out: dict[tuple[str, int], int] = {}
        for tp in tps:
            if tp.topic not in topics:
                continue
            try:
                end = consumer.highwater(tp)
            except Exception:  # not fetched yet
                continue
            if end is None:
                continue
            out[(tp.topic, tp.partition)] = max(int(end) - int(committed.get(tp) or 0), 0)
        return out

    def sources(self) -> WorkerSources:
        """What a scrape samples from this worker."""
        app = self.app

        def counters() -> dict[str, int]:
            ops = self.runtime.durability if app._runtime_started else None
            return ops.metrics() if ops is not None else {}

        def dead_letters() -> dict[tuple[str, str], int]:
            runner = getattr(self, "runner", None)
            return dict(runner.letters) if runner is not None else {}

        tiers = app.botmesh_tiers
        return WorkerSources(
            counters=counters,
            forced_rebalances=lambda: app.botmesh_watch.forced if app.botmesh_watch else 0,
            dead_letters=dead_letters,
            ready=lambda: self.readiness().ready,
            partitions_owned=lambda: len(self.inbound_assigned()),
            partitions_restoring=self.restoring,
            lag=self.lag,
            parked=(lambda: dict(tiers.parked)) if tiers is not None else dict,
            unsettled=lambda: self.runner.unsettled,
        )

    async def process(self, stream: Any) -> None:
        """The inbound agent: each batch handed to the pipeline as it is taken."""
        config = self.config
        async for events in stream.take_events(config.batch_size, within=config.batch_within):
            await self.pipeline.submit(events)


def _publish_metrics(
    app: Any, runtime: RuntimeLike, topic: str, config: WorkerConfig, wiring: Wiring
) -> None:
    """Every ``config.metrics_interval`` seconds, and once at a clean stop, produce the
    engine's counters to ``topic`` (``<prefix>.metrics``, keyed by the instance id), with
    the worker's readiness (``/readyz``) and the journal partitions it is restoring."""
    instance = str(getattr(runtime, "instance_id", config.instance_id or ""))

    async def publish(*_: Any) -> None:  # Faust passes the app to a timer that takes one
        ops = runtime.durability if app._runtime_started else None
        if ops is None:
            return
        counters = ops.metrics()
        watch = app.botmesh_watch
        if watch is not None:
            counters["forcedRebalances"] = watch.forced
        readiness = wiring.readiness()
        key, value = metrics_record(
            instance,
            counters,
            time.time(),
            ready=readiness.ready,
            why=readiness.why,
            restoring=wiring.restoring(),
        )

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


def run_worker(
    bot: BotDefinition,
    provider: Provider,
    config: WorkerConfig,
    *,
    logging_config: dict[str, Any] | None = None,
    record_scope: RecordScope | None = None,
    journal_written: Callable[[float], None] | None = None,
    fallbacks: Mapping[str, Provider] | None = None,
) -> None:
    """Provision the topics (idempotent), then run the worker until SIGTERM / Ctrl-C.
    ``fallbacks``: the other channels a send's ``Fallback`` may name, by name.

    What the command line brings (``botmesh.logs``, ``botmesh.tracing``: this package imports
    neither): ``logging_config``, the ``logging.config.dictConfig`` Faust's worker sets the
    process's logging up with (else mode's own lines); ``record_scope``, what the runner
    settles each record inside (its log context and span); ``journal_written``, told the
    seconds of each awaited journal write too (its span)."""
    if config.provision:
        have = existing_topics(config.kafka)
        specs = config.catalog.specs_beside(have, config.partitions, config.replication)
        result = ensure_topics(config.kafka, specs)
        if result.created:
            log.info("created topics: %s", ", ".join(result.created))
        made = {s.name: s.partitions for s in specs if s.name in result.created}
        _check_copartitioned(config.catalog, {**have, **made})
    config.data_dir.mkdir(parents=True, exist_ok=True)
    app = build_app(bot, provider, config, fallbacks=fallbacks)
    if record_scope is not None:
        app.botmesh_runner.scope = record_scope
    journal: TableKv | None = app.botmesh_journal
    if journal_written is not None and journal is not None:
        journal.write_seconds = _both(journal.write_seconds, journal_written)
    worker = _Worker(
        app, loglevel=config.loglevel, redirect_stdouts=False, logging_config=logging_config
    )
    worker.stop_timeout = config.stop_timeout
    # Faust's progress spinner sets the root logger to DEBUG at a level of warning or above,
    # so every aiokafka debug call builds a record: 30-40% of a durable worker's time.
    worker.spinner = None
    worker.execute_from_commandline()


def _both(
    first: Callable[[float], None] | None, then: Callable[[float], None]
) -> Callable[[float], None]:
    if first is None:
        return then

    def both(seconds: float) -> None:
        first(seconds)
        then(seconds)

    return both
