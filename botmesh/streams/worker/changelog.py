"""The journal's changelog on librdkafka: ``RdChangelog``, the ``ChangelogPort`` of
``botmesh.streams.table_kv.TableKv`` on one confluent-kafka ``Producer`` per worker.

**One producer, one poll thread.** librdkafka's producer is thread-safe: the event loop
hands records over (``produce`` never blocks: a record goes into librdkafka's queue), and a
thread of ours serves the delivery reports (``Producer.poll``). A report is queued here and
the loop is woken once for all the reports that arrive before it runs
(``loop.call_soon_threadsafe``), so a burst of acks costs one wake-up, not one per record.
confluent-kafka's ``AIOProducer`` is not used: it holds records in a Python buffer until
1000 of them, a flush, or a second without any produce (read in its source).

**at_least_once.** ``produce`` returns a future resolved by the broker's ack (acks=all,
idempotent). The records of one partition acked in one wake-up are written into the
partition's ``JournalDb`` in one atomic batch, with their index entries and the changelog
offset of the last one, before their futures resolve; then ``TableKv.persisted`` drops them
from the journal's memory. A record that is not acked (``message.timeout.ms`` passed, the
broker is down) fails its future with ``JournalUnavailableError``, and its partition is
marked broken (``TableKv.broken``): it may be in the log after all, so no later offset may
be recorded as persisted past it until the partition is restored again.

**exactly_once.** One transactional producer for the worker (``transactional.id`` from
``botmesh.streams.worker.clients.transactional_id``), all partitions in one transaction
(EOS v2): ``produce`` returns a future resolved once the transaction holding the record
committed; ``commit_soon`` commits it soon (one commit for every record produced before it
begins; records produced while it runs wait and go into the next). Only committed records
reach RocksDB (the partition's records of the transaction in one batch). A transaction that
does not commit is aborted and its records fail with ``JournalUnavailableError``; a producer
fenced by a newer one with the same ``transactional.id`` (``_FENCED``, ``PRODUCER_FENCED``,
``INVALID_PRODUCER_EPOCH``) fails them with ``ProducerFencedError`` (a ``FencedError``:
another worker owns the partitions now; not an outage, never retried) and refuses every
later record. ``send_offsets`` puts the consumer's offsets into the open transaction (with
the consumer's group metadata, so a zombie's commit is refused by the group coordinator):
they commit with the journal records, or not at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from botmesh.state.errors import FencedError, JournalUnavailableError
from botmesh.streams.journal_db import JournalDb
from botmesh.streams.table_kv import MembershipUnconfirmed

if TYPE_CHECKING:
    from botmesh.streams.table_kv import TableKv

__all__ = [
    "ABORTED_AGAIN",
    "FENCED_CODES",
    "TIMED_OUT_TXN",
    "ProducerFencedError",
    "RdChangelog",
    "lost_transaction",
]

#: How many times a transaction aborted on an abortable error is produced again before its
#: records fail.
ABORTED_AGAIN = 2
#: Seconds a transaction waits before it commits under ``exactly_once``, so that the
#: writes of every chat that is about to write join it: one commit for many journal writes.
TXN_LINGER_S = 0.005

log = logging.getLogger("botmesh.journal")

#: The errors of a producer a newer one with the same ``transactional.id`` fenced
#: (librdkafka reports ``_FENCED`` for both broker codes once it has seen one).
FENCED_CODES = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)


class ProducerFencedError(FencedError):
    """A changelog record refused because a newer producer with this worker's
    ``transactional.id`` fenced this one: another incarnation of the worker owns its
    partitions now. Stop; never retry."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(key, -1, None)
        self.reason = reason

    def __str__(self) -> str:
        return (
            f"changelog record {self.key!r} refused: a newer producer with this worker's "
            f"transactional id fenced this one ({self.reason}); another worker owns its "
            "partitions now"
        )


#: What ``INVALID_TXN_STATE`` means where a worker ends its transaction: the coordinator
#: aborted it already, past ``transaction.timeout.ms`` (the worker stood still that long).
TIMED_OUT_TXN = (
    "the transaction coordinator no longer holds this worker's transaction (it timed out "
    "while the worker stood still; another worker may own its partitions now)"
)


def lost_transaction(err: KafkaError) -> str:
    """Words for an ``INVALID_TXN_STATE`` (the coordinator aborted the transaction past its
    timeout, while the worker stood still) ending in ``": "``; nothing for other errors."""
    return f"{TIMED_OUT_TXN}: " if err.code() == KafkaError.INVALID_TXN_STATE else ""


def _failure(err: KafkaError, key: bytes, what: str = "not acked by the broker") -> Exception:
    """The exception a record's awaitable raises for librdkafka's error ``err``."""
    if err.code() in FENCED_CODES:
        return ProducerFencedError(key.decode(errors="replace"), f"{err.name()}: {err.str()}")
    why = lost_transaction(err)
    return JournalUnavailableError(
        f"changelog record {key.decode(errors='replace')!r} {what}: {why}{err.name()}: {err.str()}"
    )


def _kafka_error(exc: KafkaException) -> KafkaError:
    first = exc.args[0] if exc.args else None
    if isinstance(first, KafkaError):
        return first
    return KafkaError(KafkaError._FAIL, str(exc))


class _Sent:
    """A record handed to the producer: what its future waits for. ``topic`` is ``None``
    for a changelog record (written to RocksDB once durable), else the topic of a record the
    worker sends beside the journal (a receipt, a dead letter: ``RdChangelog.send``)."""

    __slots__ = ("error", "future", "headers", "key", "offset", "partition", "topic", "value")

    def __init__(
        self,
        partition: int,
        key: bytes,
        value: bytes | None,
        future: asyncio.Future[int],
        topic: str | None = None,
        *,
        headers: list[tuple[str, str | bytes | None]] | None = None,
    ) -> None:
        self.partition = partition
        self.key = key
        self.value = value
        self.future = future
        self.topic = topic
        self.headers = headers
        #: The broker's offset once acked; ``None`` before the delivery report.
        self.offset: int | None = None
        self.error: KafkaError | None = None


def _fail(future: asyncio.Future[int], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
        future.exception()  # retrieved: a caller that gave up waiting is not warned about


class RdChangelog:
    """The journal's ``ChangelogPort`` on one confluent-kafka producer (see the module
    docstring). ``config``: the producer's (``clients.producer_config``; transactional when
    it has a ``transactional.id``); ``unconfirmed``: answers ``unconfirmed()`` (the consumer
    loop's membership check as of a ``time.monotonic()``, else now; by default the
    membership is always confirmed). ``start`` before use, ``stop`` at the end; ``attach``
    each partition's restored database."""

    def __init__(
        self,
        config: dict[str, Any],
        topic: str,
        *,
        unconfirmed: Callable[[float | None], str | None] | None = None,
        commit_timeout: float = 30.0,
        poll_interval: float = 0.05,
    ) -> None:
        self.config = dict(config)
        self.topic = topic
        self.transactional = "transactional.id" in config
        self.commit_timeout = commit_timeout
        self.poll_interval = poll_interval
        self._confirmation = unconfirmed
        #: The journal told of each record written to RocksDB (``TableKv.persisted``).
        self.kv: TableKv | None = None
        #: Each owned partition's database (``attach``).
        self.dbs: dict[int, JournalDb] = {}
        #: The header each journal record carries: ``botmesh.writer`` =
        #: ``<instance id>@<group generation>`` (``writer``), the evidence a frozen
        #: worker's writes are read by (``tests/kafka/test_kill_freeze.py``).
        self.headers: list[tuple[str, str | bytes | None]] = []
        #: Records handed to the producer, and transactions committed (``exactly_once``).
        self.produced = 0
        self.commits = 0
        #: Transactions aborted on an abortable error and produced again (``exactly_once``).
        self.aborted = 0
        self._producer: Producer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        # delivery reports, handed from librdkafka's serving thread to the loop
        self._lock = threading.Lock()
        self._reports: list[tuple[_Sent, KafkaError | None, int]] = []
        self._wake = False
        #: When the last delivery report came (``time.monotonic()``, in librdkafka's thread),
        #: and that of the last drained (``unconfirmed(acked=True)``).
        self._reported_at = 0.0
        self._acked_at = 0.0
        self._reported = asyncio.Event()
        self._broken: set[int] = set()
        # exactly_once: the open transaction
        self._txn: list[_Sent] = []
        self._txn_offsets = False
        #: A record was refused because the transaction went abortable: the next commit
        #: runs (and aborts, and produces its records again) even with nothing in it.
        self._needs_abort = False
        self._open = asyncio.Event()
        self._busy = asyncio.Lock()
        self._want_commit = False
        self._committer: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._fatal_error: KafkaError | None = None
        #: Told once, on the loop, when the producer fails for good (fenced, a fatal error):
        #: the worker cannot write its journal any more and starts afresh.
        self.on_fatal: Callable[[KafkaError], None] | None = None

    # -- life -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Create the producer and its serving thread; under ``exactly_once``,
        ``init_transactions`` (which aborts what an earlier producer with the same id left
        open, and fences it) and the first transaction."""
        if self._producer is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._fatal = None
        self._open.clear()  # under exactly_once: records wait for the first transaction
        producer = Producer({**self.config, "error_cb": self._on_error})
        self._stopping = threading.Event()
        thread = threading.Thread(
            target=self._serve, args=(producer, self._stopping), name="botmesh-changelog"
        )
        thread.daemon = True
        thread.start()
        self._producer, self._thread = producer, thread
        if self.transactional:
            try:
                await asyncio.to_thread(producer.init_transactions, self.commit_timeout)
                producer.begin_transaction()
            except KafkaException as exc:
                await self._stop_thread()
                self._producer = None
                self._open.set()  # the records waiting: refused (stopped)
                err = _kafka_error(exc)
                raise JournalUnavailableError(
                    f"changelog producer {self.config.get('transactional.id')!r}: transactions "
                    f"not initialised: {err.name()}: {err.str()}"
                ) from exc
        self._open.set()

    async def stop(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Deliver what is in flight (up to ``timeout``, default ``commit_timeout``), then
        stop. Under ``exactly_once`` an open transaction is aborted: a clean stop commits
        first (``TableKv.close`` does). Records not delivered fail."""
        producer = self._producer
        if producer is None:
            return
        wait = self.commit_timeout if timeout is None else timeout
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transactional:
            async with self._busy:
                self._open.clear()
                pending, self._txn = self._txn, []
                self._txn_offsets = False
                if pending and self._fatal is None:
                    try:
                        await asyncio.to_thread(producer.abort_transaction, wait)
                    except KafkaException as exc:
                        log.warning("changelog transaction not aborted at the stop: %s", exc)
                for sent in pending:
                    _fail(
                        sent.future,
                        JournalUnavailableError(
                            "the changelog stopped before the transaction holding "
                            f"{sent.key!r} committed"
                        ),
                    )
        else:
            left = await asyncio.to_thread(producer.flush, wait)
            if left:
                producer.purge()  # their reports say so: their futures fail
                await asyncio.to_thread(producer.flush, 1.0)
        await self._stop_thread()
        self._producer = None
        self._drain()
        self._open.set()  # records waiting for the next transaction: refused (stopped)

    async def _stop_thread(self) -> None:
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            await asyncio.to_thread(thread.join)

    def _serve(self, producer: Producer, stopping: threading.Event) -> None:
        """The serving thread: delivery reports (and librdkafka's other callbacks)."""
        while not stopping.is_set():
            try:
                producer.poll(self.poll_interval)
            except KafkaException as exc:  # a fatal error, when no error_cb took it
                self._on_error(_kafka_error(exc))

    def _on_error(self, err: KafkaError) -> None:
        """librdkafka's error callback (in a thread serving the producer). A fatal error
        (the producer fenced, an idempotence failure) ends the producer: every later
        record is refused with it. Others (a broker out of reach) are retried by
        librdkafka; a record that waits too long is reported lost."""
        if not err.fatal():
            log.debug("changelog producer: %s", err.str())
            return
        log.error("changelog producer failed: %s: %s", err.name(), err.str())
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._failed, err)

    def _failed(self, err: KafkaError) -> None:
        if self._fatal is None:
            self._fatal = err
        self._open.set()  # the records waiting for a transaction see the failure

    @property
    def _fatal(self) -> KafkaError | None:
        return self._fatal_error

    @_fatal.setter
    def _fatal(self, err: KafkaError | None) -> None:
        first = self._fatal_error is None and err is not None
        self._fatal_error = err
        if first and err is not None and self.on_fatal is not None and self._loop is not None:
            self._loop.call_soon(self.on_fatal, err)

    @property
    def committing(self) -> bool:
        """A transaction commit runs (records produced now wait for the next one)."""
        return self.transactional and self._producer is not None and not self._open.is_set()

    # -- the databases ----------------------------------------------------------------------

    def writer(self, instance: str, generation: int) -> None:
        """Who writes the journal records from now on: this worker, in this generation of
        the group (header ``botmesh.writer``)."""
        self.headers = [("botmesh.writer", f"{instance}@{generation}".encode())]

    def attach(self, partition: int, db: JournalDb) -> None:
        """The partition's database (restored): acked records of it are written there."""
        self.dbs[partition] = db
        self._broken.discard(partition)

    def detach(self, partition: int) -> JournalDb | None:
        """Forget the partition's database (revoked); returns it for the caller to close."""
        self._broken.discard(partition)
        return self.dbs.pop(partition, None)

    def database(self, partition: int) -> JournalDb:
        db = self.dbs.get(partition)
        if db is None:
            raise JournalUnavailableError(
                f"journal partition {partition} has no database on this worker (not restored)"
            )
        return db

    # -- ChangelogPort ----------------------------------------------------------------------

    def unconfirmed(self, *, acked: bool = False) -> str | None:
        if self._confirmation is None:
            return None
        # ``acked``: as of the last delivery report drained (when librdkafka's thread had it;
        # a transaction's records: now, their commit just ended)
        return self._confirmation(None if self.transactional or not acked else self._acked_at)

    async def produce(self, partition: int, key: bytes, value: bytes | None) -> asyncio.Future[int]:
        """Hand one record to the producer; the future resolves with its offset once it is
        durable (acked; under ``exactly_once`` committed), or raises
        ``JournalUnavailableError`` / ``ProducerFencedError``."""
        deadline: float | None = None
        while True:
            producer = self._producer
            if self._fatal is not None:
                raise _failure(self._fatal, key, "refused: the changelog producer failed")
            if producer is None or self._loop is None:
                raise JournalUnavailableError(
                    f"changelog record {key!r} not produced: the changelog is stopped"
                )
            if self.transactional and not self._open.is_set():
                await self._open.wait()  # a commit runs: this record goes into the next
                continue
            future: asyncio.Future[int] = self._loop.create_future()
            sent = _Sent(partition, key, value, future, headers=self.headers)
            try:
                self._produce(producer, sent)
            except BufferError:  # librdkafka's queue is full: wait for acks to make room
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.commit_timeout
                elif now > deadline:
                    raise JournalUnavailableError(
                        f"changelog record {key!r} not produced: the producer's queue stayed "
                        f"full for {self.commit_timeout:g}s"
                    ) from None
                await asyncio.sleep(self.poll_interval)
                stale = self.unconfirmed()  # the wait may have spanned a freeze
                if stale is not None:
                    raise MembershipUnconfirmed(
                        f"changelog record {key!r} not produced: {stale}"
                    ) from None
                continue
            except KafkaException as exc:
                if self._abortable(exc, deadline):
                    deadline = deadline or time.monotonic() + self.commit_timeout
                    await asyncio.sleep(self.poll_interval)
                    continue
                raise _failure(_kafka_error(exc), key, "not produced") from exc
            self.produced += 1
            if self.transactional:
                self._txn.append(sent)
            return future

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        *,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
    ) -> asyncio.Future[int]:
        """Hand a record of another topic (a receipt, a dead letter, a parked retry) to the
        worker's one producer; the future resolves with its offset once it is durable: on
        its ack, or under ``exactly_once`` once the transaction holding it (with the journal
        records and the offsets of the same turn) committed, which this asks for soon.
        ``partition``: the key's (murmur2) unless given. librdkafka's refusal of the record
        (too large, an unknown topic) is raised, or fails the future, as its
        ``KafkaException``, so the sender reads its code."""
        deadline: float | None = None
        while True:
            producer = self._producer
            if self._fatal is not None:
                raise _failure(self._fatal, key or b"", f"refused on {topic}: the producer failed")
            if producer is None or self._loop is None:
                raise JournalUnavailableError(f"record for {topic} not produced: stopped")
            if self.transactional and not self._open.is_set():
                await self._open.wait()
                continue
            future: asyncio.Future[int] = self._loop.create_future()
            sent = _Sent(
                -1 if partition is None else partition,
                key or b"",
                value,
                future,
                topic,
                headers=list(headers),
            )
            try:
                self._produce(producer, sent)
            except BufferError:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.commit_timeout
                elif now > deadline:
                    raise JournalUnavailableError(
                        f"record for {topic} not produced: the producer's queue stayed full "
                        f"for {self.commit_timeout:g}s"
                    ) from None
                await asyncio.sleep(self.poll_interval)
                continue
            except KafkaException as exc:
                if self._abortable(exc, deadline):
                    deadline = deadline or time.monotonic() + self.commit_timeout
                    await asyncio.sleep(self.poll_interval)
                    continue
                raise
            # another KafkaException (too large, unknown topic) goes to the sender as it is
            if self.transactional:
                self._txn.append(sent)
                self.commit_soon(())
            return future

    def _abortable(self, exc: KafkaException, deadline: float | None) -> bool:
        """librdkafka refused a record because the open transaction went abortable (a
        produce in the erroneous state): the commit asked for now aborts it and produces
        its records again (``_commit_or_abort``), then this record can go. False past
        ``deadline``, or for any other refusal."""
        err = _kafka_error(exc)
        if not self.transactional or err.code() != KafkaError._STATE or err.fatal():
            return False
        if deadline is not None and time.monotonic() > deadline:
            return False
        self._needs_abort = True
        self.commit_soon(())
        return True

    def _produce(self, producer: Producer, sent: _Sent) -> None:
        """Hand ``sent`` to librdkafka (a record of another topic may have no key)."""
        producer.produce(
            sent.topic or self.topic,
            sent.value,
            sent.key if sent.topic is None else (sent.key or None),
            sent.partition,
            on_delivery=functools.partial(self._report, sent),
            headers=sent.headers,
        )

    def commit_soon(self, partitions: Sequence[int], delay: float = 0.0) -> None:
        """Commit the worker's open transaction soon (every partition's records are in
        it); with ``delay``, that many seconds later (one timer at a time). Nothing under
        ``at_least_once``."""
        if not self.transactional or self._loop is None:
            return
        if delay > 0:
            if self._timer is None:
                self._timer = self._loop.call_later(delay, self._commit_timer)
            return
        self._want_commit = True
        if self._committer is None or self._committer.done():
            self._committer = self._loop.create_task(self._commit_loop())

    def _commit_timer(self) -> None:
        self._timer = None
        if self._producer is not None:
            self.commit_soon((), 0.0)

    async def _commit_loop(self) -> None:
        while self._want_commit:
            # let the writes of the chats the last commit released join this one: they need
            # the loop for a moment first, and a commit started at once would hold only the
            # first few (bench_worker: 234 records/s without, about 500 with 2-10 ms)
            await asyncio.sleep(TXN_LINGER_S)
            self._want_commit = False
            try:
                await self._commit_once()
            except Exception as exc:  # its records' futures say so
                log.warning("changelog transaction not committed: %s", exc)

    async def commit(self) -> None:
        """Commit the open transaction now (every record produced and every offset sent
        before the call): returns once it committed, raises when it did not."""
        await self._commit_once()

    async def send_offsets(self, offsets: list[TopicPartition], group_metadata: Any) -> None:
        """Put the consumer's offsets (the next offset to read, per partition) into the open
        transaction, with the consumer's current ``consumer_group_metadata()``: they commit
        with the transaction's journal records (EOS v2), or not at all."""
        if not self.transactional:
            raise RuntimeError("send_offsets: the changelog is not transactional")
        while True:
            await self._open.wait()
            async with self._busy:
                producer = self._producer
                if self._fatal is not None:
                    raise _failure(self._fatal, b"", "offsets refused")
                if producer is None:
                    raise JournalUnavailableError("offsets not sent: the changelog is stopped")
                if not self._open.is_set():
                    continue
                self._txn_offsets = True
                try:
                    await asyncio.to_thread(
                        producer.send_offsets_to_transaction,
                        offsets,
                        group_metadata,
                        self.commit_timeout,
                    )
                except KafkaException as exc:
                    err = _kafka_error(exc)
                    if err.code() in FENCED_CODES or err.fatal():
                        self._fatal = err
                    elif err.txn_requires_abort():  # offsets of a generation gone by
                        await self._abort_and_again(producer, err)
                    raise _failure(err, b"<offsets>", "not sent to the transaction") from exc
                return

    async def _commit_once(self) -> None:
        async with self._busy:
            producer = self._producer
            if producer is None:
                return
            batch, self._txn = self._txn, []
            offsets, self._txn_offsets = self._txn_offsets, False
            stuck, self._needs_abort = self._needs_abort, False
            if not batch and not offsets and not stuck:
                return
            if self._fatal is not None:
                error = _failure(self._fatal, batch[0].key if batch else b"", "refused")
                for sent in batch:
                    _fail(sent.future, error)
                raise error
            self._open.clear()  # records produced from now on go into the next transaction
            try:
                stale = self.unconfirmed()
                if stale is not None:  # maybe evicted: its records must not land after a peer's
                    await self._abort(producer, batch, stale)
                else:
                    await self._commit_or_abort(producer, batch)
            finally:
                if self._fatal is None and producer is self._producer:
                    try:
                        producer.begin_transaction()
                    except KafkaException as exc:
                        self._fatal = _kafka_error(exc)
                        log.error("changelog transaction not begun: %s", exc)
                    else:
                        self._open.set()
                if self._fatal is not None:
                    self._open.set()  # the waiting records see the failure

    async def _abort(self, producer: Producer, batch: list[_Sent], why: str) -> None:
        """Abort the open transaction instead of committing it: this worker's membership is
        not confirmed (``unconfirmed``), so a peer may own its partitions and have restored
        them already; records committed now would land behind the peer's back."""
        failure = MembershipUnconfirmed(f"transaction aborted, not committed: {why}")
        try:
            await asyncio.to_thread(producer.abort_transaction, self.commit_timeout)
        except KafkaException as exc:
            err = _kafka_error(exc)
            log.error("changelog transaction not aborted: %s", err.str())
            self._fatal = err  # fenced, or timed out by the coordinator: start afresh
        for sent in batch:
            _fail(sent.future, failure)
        raise failure

    async def _commit_or_abort(self, producer: Producer, batch: list[_Sent]) -> None:
        error: KafkaError | None = None
        for again in range(ABORTED_AGAIN + 1):
            error = await self._try_commit(producer)
            if error is None:
                self.commits += 1
                await self._committed(batch)
                return
            abortable = error.txn_requires_abort() and not error.fatal()
            if not abortable or error.code() in FENCED_CODES or again == ABORTED_AGAIN:
                break
            # abortable: offsets of a generation the group left behind (a rebalance began
            # after the checkpoint read them), a record the broker refused for a while. The
            # records are still what the journal holds: abort, and produce them again in a
            # new transaction (without the offsets: the next checkpoint sends them anew)
            try:
                await asyncio.to_thread(producer.abort_transaction, self.commit_timeout)
                producer.begin_transaction()
            except KafkaException as exc:
                error = _kafka_error(exc)
                self._fatal = error
                log.error("changelog transaction not aborted: %s", error.str())
                break
            self.aborted += 1
            log.warning(
                "changelog transaction aborted (%s): its %d records produced again in a new one",
                error.str(),
                len(batch),
            )
            batch = self._again(producer, batch)
        assert error is not None
        key = batch[0].key if batch else b"<offsets>"
        if error.code() in FENCED_CODES or error.fatal():
            self._fatal = error
            failure = _failure(error, key, "not committed")
        else:
            failure = _failure(error, key, "not committed (its transaction was aborted)")
            try:
                await asyncio.to_thread(producer.abort_transaction, self.commit_timeout)
            except KafkaException as exc:
                abort_error = _kafka_error(exc)
                log.error("changelog transaction not aborted: %s", abort_error.str())
                if abort_error.fatal() or abort_error.code() in FENCED_CODES:
                    self._fatal = abort_error
        for sent in batch:
            _fail(sent.future, failure if self._fatal is None else _failure(error, sent.key))
        raise failure

    async def _abort_and_again(self, producer: Producer, error: KafkaError) -> None:
        """The open transaction went abortable (``_busy`` held): abort it, begin another and
        produce its records again there, without offsets (the next checkpoint sends them)."""
        self._open.clear()
        try:
            await asyncio.to_thread(producer.abort_transaction, self.commit_timeout)
            producer.begin_transaction()
        except KafkaException as exc:
            self._fatal = _kafka_error(exc)
            log.error("changelog transaction not aborted: %s", exc)
            self._open.set()
            return
        self.aborted += 1
        batch, self._txn = self._txn, []
        self._txn_offsets = False
        log.warning(
            "changelog transaction aborted (%s): its %d records produced again in a new one",
            error.str(),
            len(batch),
        )
        self._txn = self._again(producer, batch)
        self._open.set()

    async def _try_commit(self, producer: Producer) -> KafkaError | None:
        """Commit the open transaction (retriable errors: again; librdkafka resumes it)."""
        error: KafkaError | None = None
        for _ in range(3):
            try:
                await asyncio.to_thread(producer.commit_transaction, self.commit_timeout)
            except KafkaException as exc:
                error = _kafka_error(exc)
                if error.retriable() and not error.txn_requires_abort() and not error.fatal():
                    continue
                return error
            return None
        return error

    def _again(self, producer: Producer, batch: list[_Sent]) -> list[_Sent]:
        """``batch``'s records produced again, in their order, into the transaction just
        begun; a journal record of a partition handed over meanwhile is not (its future
        fails: the partition is another worker's now)."""
        out: list[_Sent] = []
        for old in batch:
            if old.future.done():
                continue
            if old.topic is None and old.partition not in self.dbs:
                _fail(
                    old.future,
                    JournalUnavailableError(
                        f"changelog record {old.key!r} not committed: its transaction was "
                        f"aborted and partition {old.partition} is not this worker's any more"
                    ),
                )
                continue
            sent = _Sent(
                old.partition, old.key, old.value, old.future, old.topic, headers=old.headers
            )
            try:
                self._produce(producer, sent)
            except (BufferError, KafkaException) as exc:
                _fail(old.future, JournalUnavailableError(f"not produced again: {exc}"))
                continue
            out.append(sent)
        return out

    async def _committed(self, batch: list[_Sent]) -> None:
        """The transaction committed: its records are in the log (the commit flushed them),
        each with its delivery report served; write them to RocksDB, then resolve them."""
        self._drain()
        deadline = time.monotonic() + self.commit_timeout
        while any(s.offset is None and s.error is None for s in batch):
            # a report served by the commit's thread and not handed to the loop yet
            self._reported.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                async with asyncio.timeout(left):
                    await self._reported.wait()
            except TimeoutError:
                break
        by_partition: dict[int, list[_Sent]] = {}
        for sent in batch:
            if sent.offset is not None and sent.topic is None:
                by_partition.setdefault(sent.partition, []).append(sent)
        for p, sents in by_partition.items():
            self._persist(p, sents)
        for sent in batch:
            if sent.offset is not None:
                if not sent.future.done():
                    sent.future.set_result(sent.offset)
            else:  # not possible after a commit: said loudly if it happens
                why = sent.error.str() if sent.error is not None else "no delivery report"
                _fail(
                    sent.future,
                    JournalUnavailableError(
                        f"changelog record {sent.key!r} committed without its ack: {why}"
                    ),
                )

    # -- delivery reports -------------------------------------------------------------------

    def _report(self, sent: _Sent, err: KafkaError | None, msg: Message[Any, Any]) -> None:
        """librdkafka's delivery report (in a thread serving the producer)."""
        offset = msg.offset() if err is None else None
        with self._lock:
            self._reports.append((sent, err, -1 if offset is None else offset))
            self._reported_at = time.monotonic()
            if self._wake:
                return
            self._wake = True
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        """The delivery reports that arrived (on the loop)."""
        with self._lock:
            reports, self._reports = self._reports, []
            self._wake = False
            self._acked_at = self._reported_at
        if not reports:
            return
        self._reported.set()
        if self.transactional:  # resolved at the commit
            for sent, err, offset in reports:
                if err is None:
                    sent.offset = offset
                else:
                    sent.error = err
            return
        acked: dict[int, list[_Sent]] = {}
        for sent, err, offset in reports:
            if sent.topic is not None:  # not the journal's: nothing to write to RocksDB
                if err is None:
                    if not sent.future.done():
                        sent.future.set_result(offset)
                else:  # librdkafka's own error: the sender reads its code (too large?)
                    _fail(sent.future, KafkaException(err))
                continue
            if err is None:
                sent.offset = offset
                acked.setdefault(sent.partition, []).append(sent)
            else:
                sent.error = err
                self._lost(sent, _failure(err, sent.key))
        for p, sents in acked.items():
            self._persist(p, sents)
        for sents in acked.values():
            for sent in sents:
                if not sent.future.done():
                    sent.future.set_result(sent.offset)  # type: ignore[arg-type]

    def _broken_set(self) -> set[int]:
        return self.kv.broken if self.kv is not None else self._broken

    def _lost(self, sent: _Sent, error: Exception) -> None:
        # maybe in the log after all: no later offset may be recorded past it
        if self.kv is None or self.kv.loaded(sent.partition):
            self._broken_set().add(sent.partition)
        _fail(sent.future, error)

    def _persist(self, p: int, sents: list[_Sent]) -> None:
        """Write durable records of partition ``p`` into its database in one batch, with
        the offset of the last one (then ``TableKv.persisted``)."""
        kv = self.kv
        if kv is not None and not kv.loaded(p):
            return  # not ours (any more), or broken: its restore reads the changelog
        if p in self._broken_set():
            return
        db = self.dbs.get(p)
        if db is None:
            return
        sents.sort(key=lambda s: s.offset or 0)
        try:
            db.write([(s.key, s.value) for s in sents], sents[-1].offset)
        except Exception as exc:  # the offset must never pass a record not written
            self._broken_set().add(p)
            log.error(
                "journal partition %d: RocksDB write failed (%s); its next restore reads the "
                "changelog from the last record written",
                p,
                exc,
            )
            return
        if kv is not None:
            kv.persisted(p, (s.key for s in sents))
