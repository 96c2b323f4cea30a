"""The faust-streaming defects of ``botmesh.streams.faust_app.defects``, each shown on
Faust's own code and met by botmesh's workaround (no broker needed: the consumer is never
started)."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from faust.transport.drivers.aiokafka import Consumer
from faust.types import TP
from intervaltree import IntervalTree

from botmesh.streams.faust_app.defects import (
    _ORIGINAL,
    ReadOffsets,
    guard_commit_holes,
    held_commit,
    lenient_header_keys,
)

TPX = TP("t.inbound", 0)


@pytest.fixture
def consumer() -> Any:
    """Faust's own consumer class with the commit bookkeeping its ``__init__`` sets up (the
    rest of it, the Kafka client and its thread, is not needed by ``_new_offset``)."""
    c = Consumer.__new__(Consumer)
    c._acked = defaultdict(list)
    c._acked_index = defaultdict(set)
    c._committed_offset = defaultdict(lambda: None)
    c._gap = defaultdict(IntervalTree)
    c._unacked_messages = set()
    return c


def acked(consumer: Any, committed: int | None, offsets: list[int]) -> None:
    consumer._committed_offset[TPX] = committed
    consumer._acked[TPX] = list(offsets)
    consumer._acked_index[TPX] = set(offsets)


def test_faust_commits_past_a_hole_of_one_offset_and_the_guard_holds_the_commit(
    consumer: Any,
) -> None:
    # committed = 7651 is the next offset to read: 7651 never reached the agent
    acked(consumer, 7651, [7652, 7653])
    assert _ORIGINAL(consumer, TPX) == 7654  # the defect: 7651 would be lost at a restart
    acked(consumer, 7651, [7652, 7653])
    guard_commit_holes()
    assert held_commit(consumer, TPX)
    assert consumer._new_offset(TPX) is None  # held: the next start redelivers 7651
    acked(consumer, 7651, [7651, 7652, 7653])
    assert consumer._new_offset(TPX) == 7654  # no hole: committed as Faust would


def test_a_hole_at_a_record_still_being_settled_holds_the_commit_without_a_seek(
    consumer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker settles batches side by side: the records after a slow one are acked
    first. The commit stays before the slow one, and nothing is read again."""
    guard_commit_holes()
    acked(consumer, 500, [501, 502, 503])
    consumer._unacked_messages = [SimpleNamespace(tp=TPX, offset=500)]
    assert consumer._new_offset(TPX) is None
    assert "was never handed to the agent" not in caplog.text
    consumer._unacked_messages = set()  # settled and acked
    acked(consumer, 500, [500, 501, 502, 503])
    assert consumer._new_offset(TPX) == 504


def test_a_committed_offset_of_zero_is_not_checked_by_faust_and_is_by_the_guard(
    consumer: Any,
) -> None:
    acked(consumer, 0, [1, 2])
    assert _ORIGINAL(consumer, TPX) == 3  # the defect: offset 0 skipped
    acked(consumer, 0, [1, 2])
    guard_commit_holes()
    assert consumer._new_offset(TPX) is None


def test_a_gap_faust_recorded_itself_is_left_to_faust(consumer: Any) -> None:
    guard_commit_holes()
    acked(consumer, 10, [12, 13])
    consumer._gap[TPX].addi(10, 12)  # e.g. a transaction marker it saw in the stream
    assert not held_commit(consumer, TPX)
    assert consumer._new_offset(TPX) == 14


class _Store:
    """What ``TableManager`` calls on a table's store: the persisted offsets it set."""

    def __init__(self) -> None:
        self.persisted: dict[TP, int] = {}

    def set_persisted_offset(self, tp: TP, offset: int) -> None:
        self.persisted[tp] = offset


def test_the_changelog_offsets_under_eos_are_never_persisted_by_faust() -> None:
    """The "changelog offsets under EOS" defect: ``Collection._on_changelog_sent`` hands
    the *changelog* TP to ``persist_offset_on_commit``, and the consumer's commit flushes
    them with ``tables.on_commit(<the committed source TPs>)``: the keys never match, so no
    changelog offset is ever persisted and every restart replays the whole changelog.
    botmesh's workaround: ``JournalTable`` persists each record and its offset itself
    after the transaction holding it committed (``test_eos``: a restart restores the tail)."""
    from faust.tables.manager import TableManager

    manager: Any = TableManager.__new__(TableManager)
    manager._pending_persisted_offsets = {}
    store = _Store()
    changelog_tp = TP("t-journal-changelog", 0)
    manager.persist_offset_on_commit(store, changelog_tp, 41)  # as _on_changelog_sent does
    manager.on_commit({TPX: 10})  # as Consumer._commit_offsets does: the source TPs
    assert store.persisted == {}  # the defect: offset 41 of the changelog never persisted
    assert manager._pending_persisted_offsets[changelog_tp] == (store, 41)
    manager.on_commit({changelog_tp: 41})  # only a changelog TP would flush it
    assert store.persisted == {changelog_tp: 41}


async def test_faust_restore_polls_the_changelog_every_5_s_and_the_worker_every_quarter_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under ``exactly_once`` a changelog ends in a transaction marker, which Faust's
    restore only detects after two empty polls (``detect_aborted_tx``): 10 s at its 5 s,
    half a second with ``shorten_recovery_poll``."""
    import asyncio
    import inspect

    from faust.tables import recovery

    from botmesh.streams.faust_app.defects import RECOVERY_POLL_S, shorten_recovery_poll

    source = inspect.getsource(recovery.Recovery)
    assert "changelog_queue.get(), timeout=5.0" in source  # Faust's own poll
    assert "timeout_count > 1" in source  # two empty polls before the position check
    shorten_recovery_poll()
    asked: list[float | None] = []
    real_wait_for = asyncio.wait_for

    async def wait_for(aw: Any, timeout: float | None) -> Any:  # noqa: ASYNC109 (its signature)
        asked.append(timeout)
        return await real_wait_for(aw, 0)

    monkeypatch.setattr(asyncio, "wait_for", wait_for)
    with pytest.raises(TimeoutError):
        await recovery.__dict__["asyncio"].wait_for(asyncio.Queue().get(), timeout=5.0)
    assert asked == [RECOVERY_POLL_S]


async def test_faust_takes_the_end_of_an_eos_restore_from_a_cache_the_worker_asks_the_broker(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Under ``exactly_once`` Faust's restore reads a changelog partition up to the consumer's
    cached last stable offset, unknown (None, which Faust turns into -1) until the consumer
    fetched the partition: a worker given back a partition it held then crashed
    (``ConsistencyError``: persisted offset > highwater -1). ``fresh_highwaters`` asks the
    broker."""

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    from botmesh.streams.faust_app.defects import _ORIGINAL_HIGHWATERS, fresh_highwaters
    from botmesh.streams.provision import ensure_topics
    from botmesh.topics.catalog import TopicSpec

    topic = f"{topic_prefix}.worker-journal-changelog"
    ensure_topics(kafka_bootstrap, [TopicSpec(topic, "changelog", 1, 1)])
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(3):
            await producer.send_and_wait(topic, b"v", key=f"k{i}".encode(), partition=0)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])  # assigned, not fetched yet: as right after a rebalance
        thread: Any = AIOKafkaConsumerThread.__new__(AIOKafkaConsumerThread)
        thread._consumer = consumer
        thread.consumer = SimpleNamespace(in_transaction=True)  # Faust under exactly_once
        assert await _ORIGINAL_HIGHWATERS(thread, [tp]) == {tp: None}
        fresh_highwaters()
        assert await AIOKafkaConsumerThread._highwaters(thread, [tp]) == {tp: 3}
    finally:
        await consumer.stop()


async def test_faust_ends_an_eos_restore_on_the_consumer_position_the_worker_checks_the_log(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Under ``exactly_once`` Faust's restore takes every offset after the last record it read
    up to the end for transaction markers and aborted records once the consumer's position
    reached the end (``detect_aborted_tx``), though records fetched may not have reached the
    restore yet: they are then dropped (a worker given back a partition loaded 136 of its
    records and sent replies again). ``verify_aborted_tails`` reads that tail first and
    seeks back to a committed record it finds there."""
    from types import SimpleNamespace

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from yarl import URL

    from botmesh.streams.faust_app.defects import (
        _ORIGINAL_POSITION,
        committed_record_between,
        verify_aborted_tails,
    )
    from botmesh.streams.provision import ensure_topics
    from botmesh.topics.catalog import TopicSpec

    topic = f"{topic_prefix}.worker-journal-changelog"
    ensure_topics(kafka_bootstrap, [TopicSpec(topic, "changelog", 1, 1)])
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, transactional_id=f"{topic_prefix}-tx", acks="all"
    )
    await producer.start()
    try:  # 0, 1 committed (marker 2); 3 aborted (marker 4); 5 committed (marker 6)
        for keys, commit in (([b"k0", b"k1"], True), ([b"k2"], False), ([b"k3"], True)):
            await producer.begin_transaction()
            for k in keys:
                await producer.send_and_wait(topic, b"v", key=k, partition=0)
            if commit:
                await producer.commit_transaction()
            else:
                await producer.abort_transaction()
    finally:
        await producer.stop()
    tp = TopicPartition(topic, 0)
    assert await committed_record_between(kafka_bootstrap, tp, 0, 7) == 0
    assert await committed_record_between(kafka_bootstrap, tp, 2, 7) == 5
    assert await committed_record_between(kafka_bootstrap, tp, 2, 5) is None  # abort, markers
    assert await committed_record_between(kafka_bootstrap, tp, 6, 7) is None  # a marker

    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        while await consumer.position(tp) < 7:  # fetched all: the position is at the end
            await consumer.getmany(tp, timeout_ms=500)

        async def position(_tp: Any) -> int:
            return int(await consumer.position(tp))

        sought: list[tuple[Any, int]] = []

        async def seek(_tp: Any, offset: int) -> None:
            sought.append((_tp, offset))

        # Faust's consumer as its restore sees it: highwater = end - 1 = 6
        recovery = SimpleNamespace(active_highwaters={tp: 6}, active_offsets={tp: 1})
        faust_consumer: Any = Consumer.__new__(Consumer)
        faust_consumer._thread = SimpleNamespace(position=position)
        faust_consumer.app = SimpleNamespace(
            tables=SimpleNamespace(recovery=recovery),
            conf=SimpleNamespace(broker=[URL(f"kafka://{kafka_bootstrap}")]),
        )
        faust_consumer.seek = seek
        # Faust's check: the position (7) is past the highwater (6) while the restore read
        # up to 1, so it would take offsets 2..6 for aborted and never load record 5
        assert await _ORIGINAL_POSITION(faust_consumer, tp) == 7  # >= 6
        verify_aborted_tails()
        assert await faust_consumer.position(tp) == -1  # not taken: read again from 2
        assert sought == [(tp, 2)]
        recovery.active_offsets[tp] = 5  # record 5 read: only a marker is left
        assert await faust_consumer.position(tp) == 7
        assert sought == [(tp, 2)]
    finally:
        await consumer.stop()


async def test_a_partition_faust_left_unrestored_is_caught_up_from_the_changelog(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Faust can report a restore complete for a partition it has not restored (a restore
    overtaken by the next rebalance: a worker loaded 0 of a partition's records and sent
    again replies its previous owner had sent). ``JournalTable`` checks every partition it
    loads against the changelog, from its database's persisted offset on, and writes the
    committed records it lacks (aborted ones never); a partition it cannot check is not
    loaded."""
    from types import SimpleNamespace

    from aiokafka import AIOKafkaProducer
    from yarl import URL

    from botmesh.streams.faust_app.table import JournalTable
    from botmesh.streams.provision import ensure_topics
    from botmesh.topics.catalog import TopicSpec

    topic = f"{topic_prefix}.worker-journal-changelog"
    ensure_topics(kafka_bootstrap, [TopicSpec(topic, "changelog", 2, 1)])
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, transactional_id=f"{topic_prefix}-tx", acks="all"
    )
    await producer.start()
    try:  # partition 0: 0, 1 committed (marker 2); 3 aborted (4); 5 committed (6)
        for pairs, commit in (
            ([(b"k0", b"v0"), (b"k1", b"v1")], True),
            ([(b"k2", b"aborted")], False),
            ([(b"k1", b"v1b")], True),
        ):
            await producer.begin_transaction()
            for k, v in pairs:
                await producer.send_and_wait(topic, v, key=k, partition=0)
            if commit:
                await producer.commit_transaction()
            else:
                await producer.abort_transaction()
        await producer.begin_transaction()  # partition 1: 0, 1 committed (marker 2)
        await producer.send_and_wait(topic, b"x", key=b"a", partition=1)
        await producer.send_and_wait(topic, None, key=b"b", partition=1)
        await producer.commit_transaction()
    finally:
        await producer.stop()

    class Store:
        """Faust's RocksDB store as the check reads it: the persisted offset of each
        partition (partition 0 restored up to offset 1, partition 1 not at all)."""

        persisted: ClassVar[dict[int, int | None]] = {0: 1, 1: None}

        def persisted_offset(self, tp: Any) -> int | None:
            return self.persisted[tp.partition]

    class Table(JournalTable):
        changelog_topic_name = topic

        def __init__(self, broker: str) -> None:  # Faust's own __init__ is not needed here
            self.app: Any = SimpleNamespace(conf=SimpleNamespace(broker=[URL(broker)]))
            self.written: dict[int, list[tuple[bytes, bytes | None, int]]] = {}

        @property
        def data(self) -> Any:  # type: ignore[override]
            return Store()

        def persist_many(
            self,
            partition: int,
            records: list[tuple[bytes, bytes | None, int]],
            offset: int | None = None,
        ) -> None:
            self.written.setdefault(partition, []).extend(records)

    table = Table(f"kafka://{kafka_bootstrap}")
    assert await table._catch_up({0, 1}) == {0, 1}
    assert table.written == {0: [(b"k1", b"v1b", 5)], 1: [(b"a", b"x", 0), (b"b", None, 1)]}

    Store.persisted = {0: 6, 1: 1}  # restored whole: nothing to write
    table = Table(f"kafka://{kafka_bootstrap}")
    assert await table._catch_up({0, 1}) == {0, 1}
    assert table.written == {}

    nowhere = Table("kafka://127.0.0.1:1")  # no broker: not checked, so not loaded
    nowhere.catch_up_s = 2.0
    assert await nowhere._catch_up({0}) == set()


class _RawKey(str):
    """A header key the Python batch builder writes as the byte 0xff (not UTF-8): what any
    producer that is not aiokafka's can put on the broker."""

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return b"\xff"


@pytest.mark.parametrize("codec", [0, 1])  # none, gzip
def test_aiokafka_refuses_a_header_key_that_is_not_utf8_and_the_worker_reads_it(
    codec: int,
) -> None:
    """aiokafka's fetcher reads a batch with its C reader, which raises on such a key (at
    every fetch of the partition, out of Faust's consumer); the worker's reader reads the
    batch again leniently, every record once, in order."""
    from aiokafka.consumer import fetcher
    from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy
    from aiokafka.record.memory_records import MemoryRecords

    builder = _DefaultRecordBatchBuilderPy(
        magic=2,
        compression_type=codec,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=100_000,
    )
    builder.append(0, timestamp=None, key=b"c", value=b"v0", headers=[("a", b"1")])
    builder.append(1, timestamp=None, key=b"c", value=b"v1", headers=[(_RawKey("x"), b"h")])
    builder.append(2, timestamp=None, key=b"c", value=b"v2", headers=[])
    data = bytes(builder.build())

    strict = MemoryRecords(data).next_batch()
    assert strict is not None
    with pytest.raises(UnicodeDecodeError):
        list(strict)

    lenient_header_keys()
    lenient_header_keys()  # idempotent
    reader = fetcher.MemoryRecords(data + data)  # what the fetcher reads a fetch with
    batches = []
    while reader.has_next():
        batch = reader.next_batch()
        assert batch.validate_crc() and batch.base_offset == 0
        batches.append([(r.offset, r.value, r.headers) for r in batch])
    assert (
        batches == [[(0, b"v0", [("a", b"1")]), (1, b"v1", [("\udcff", b"h")]), (2, b"v2", [])]] * 2
    )


def _drain(reads: Any, offsets: list[int]) -> list[int]:
    """Faust's drain loop (``Consumer._drain_messages``) over ``offsets`` of one partition:
    what it hands to the agent; a record below the read offset is dropped as seen."""
    handed = []
    for offset in offsets:
        r_offset = reads[TPX]
        if r_offset is None or offset >= r_offset:
            handed.append(offset)
            reads[TPX] = offset
    return handed


@pytest.mark.parametrize("rewinds", [False, True])
def test_a_seek_back_to_a_hole_is_undone_by_records_fetched_before_it_unless_it_is_held(
    rewinds: bool,
) -> None:
    """The guard seeks back to the hole (72) while records fetched before the seek (81, 82)
    are still being handed over: Faust moves its read offset past 72 again and drops every
    record fetched again (the defect); ``ReadOffsets`` holds the rewind until one of them
    (72) arrives, so 72..80 reach the agent."""
    reads: Any = ReadOffsets() if rewinds else defaultdict(lambda: None)
    assert _drain(reads, [77, 78, 79, 80]) == [77, 78, 79, 80]
    high = reads.get(TPX)
    reads[TPX] = 72  # Faust's ``Consumer.seek`` sets the read offset to the offset sought
    if rewinds:
        reads.rewind(TPX, 72, high)
    handed = _drain(reads, [81, 82, *range(72, 85)])  # the old records, then the refetch
    if rewinds:
        assert handed == [81, 82, *range(72, 85)]  # 81..84 twice: the journal dedupes them
        assert not reads.rewinds and reads[TPX] == 84
        # records fetched before the seek coming between those fetched again drop nothing
        reads[TPX] = 95
        reads.rewind(TPX, 90, 95)
        assert _drain(reads, [96, 90, 91, 97, 92, 93, 94, 95, 96]) == [
            96,
            90,
            91,
            97,
            92,
            93,
            94,
            95,
            96,
        ]
        assert not reads.rewinds
    else:
        assert handed == [81, 82, 82, 83, 84]  # 72..80 dropped: never handled, commit held


def test_the_guard_makes_faust_keep_its_read_offsets_in_a_read_offsets() -> None:
    from faust.transport import consumer as faust_consumer

    from botmesh.streams.faust_app import defects as faust_defects

    guard_commit_holes()
    assert faust_consumer.Consumer.__init__ is faust_defects._init
    assert faust_consumer.Consumer._add_gap is faust_defects._add_gap
    reads = ReadOffsets()
    reads.update({TPX: 5})
    reads.rewind(TPX, 3, 5)
    reads[TPX] = 4  # not the next record fetched again (3): the rewind holds
    assert reads[TPX] == 3 and reads.rewinds
    reads.update({TPX: 9})  # a fresh seek to the committed offsets ends the rewind
    assert reads[TPX] == 9 and not reads.rewinds
    reads.rewind(TPX, 3, 9)
    assert reads.pop(TPX) == 9 and not reads.rewinds  # revoked


async def test_no_gap_is_recorded_against_a_rewound_read_offset(consumer: Any) -> None:
    guard_commit_holes()
    consumer._read_offset = ReadOffsets()
    consumer._committed_offset[TPX] = 72
    consumer._read_offset.rewind(TPX, 72, 80)
    await consumer._add_gap(TPX, 73, 81)  # 81 handed while the read offset reads 72
    assert not consumer._gap[TPX]
    for offset in range(72, 81):  # the records fetched again, up to where it was: it ends
        consumer._read_offset[TPX] = offset
    await consumer._add_gap(TPX, 90, 92)
    assert consumer._gap[TPX]


async def test_offsets_the_consumer_jumped_over_become_a_gap_only_when_they_hold_no_record(
    kafka_bootstrap: str, topic_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Faust takes offsets its drain loop jumped over for transaction markers or aborted
    records (a gap) and commits past them. A record the loop never handed over (a fetch cut
    short by a generation change) was then committed past and lost: an inbound produced
    during a rebalance under ``exactly_once`` was never journaled. The guard reads the
    jumped-over offsets on the broker first: a marker becomes a gap, a record is read again
    (and the partition's commit waits at it meanwhile)."""
    import asyncio
    from types import SimpleNamespace

    from aiokafka import AIOKafkaProducer, TopicPartition
    from yarl import URL

    from botmesh.streams.faust_app import defects as faust_defects
    from botmesh.streams.faust_app.defects import read_committed
    from botmesh.streams.provision import ensure_topics
    from botmesh.topics.catalog import TopicSpec

    topic = f"{topic_prefix}.inbound"
    ensure_topics(kafka_bootstrap, [TopicSpec(topic, "inbound", 1, 1)])
    plain = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    tx = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, transactional_id=f"{topic_prefix}-tx", acks="all"
    )
    await plain.start()
    await tx.start()
    try:  # 0-3 records; 4 a record in a transaction (its marker); 2 more records
        for k in (b"k0", b"k1", b"k2", b"k3"):
            await plain.send_and_wait(topic, b"v", key=k, partition=0)
        async with tx.transaction():
            await tx.send_and_wait(topic, b"v", key=b"k4", partition=0)
        await _marker_written(kafka_bootstrap, TopicPartition(topic, 0), 6)
        for k in (b"k6", b"k7"):
            await plain.send_and_wait(topic, b"v", key=k, partition=0)
    finally:
        await plain.stop()
        await tx.stop()

    tp = TopicPartition(topic, 0)
    records = {r[2] for r in (await read_committed(kafka_bootstrap, topic, {0: 0}))[0]}
    assert records == {0, 1, 2, 3, 4, 6, 7}
    marker = 5
    sought: list[int] = []

    async def seek(_tp: Any, offset: int) -> None:
        sought.append(offset)

    guard_commit_holes()
    c: Any = Consumer.__new__(Consumer)
    c._acked = defaultdict(list)
    c._acked_index = defaultdict(set)
    c._committed_offset = defaultdict(lambda: None)
    c._gap = defaultdict(IntervalTree)
    c._read_offset = ReadOffsets()
    c.gap_checks = defaultdict(int)
    c.app = SimpleNamespace(conf=SimpleNamespace(broker=[URL(f"kafka://{kafka_bootstrap}")]))
    c.seek = seek
    c.assignment = lambda: {tp}
    c._committed_offset[tp] = marker - 1

    # the loop handed over the record before the marker and then the one after it: a gap
    c._read_offset[tp] = marker - 1
    await c._add_gap(tp, marker, marker + 1)
    assert tp in c.gap_checks and c._new_offset(tp) is None  # held while it is read
    await asyncio.gather(*faust_defects._tasks)
    assert c._gap[tp] and not c.gap_checks and sought == []

    # the loop handed over 1 and then 6: records 2 and 3 were never handed over
    c._gap[tp] = IntervalTree()
    c._committed_offset[tp] = 2
    c._read_offset[tp] = 6
    with caplog.at_level("WARNING", logger="botmesh.streams"):
        await c._add_gap(tp, 2, 6)
        await asyncio.gather(*faust_defects._tasks)
    assert not c._gap[tp], "records taken for a gap: they would be committed past"
    assert sought == [2], "the partition is not read again from the first record skipped"
    assert "offset 2 was skipped by the consumer but holds a record" in caplog.text
    assert c._read_offset.rewinds[tp] == [2, 6, 2]


async def _marker_written(bootstrap: str, tp: Any, end: int) -> None:
    """Wait until ``tp`` ends at ``end``: the broker writes a transaction's commit marker
    after the commit returned, so a record produced at once could land before it."""
    import asyncio

    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        async with asyncio.timeout(30):  # polls the broker: there is no event to wait on
            while (await consumer.end_offsets([tp]))[tp] < end:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
    finally:
        await consumer.stop()


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_one_standby_replica_under_either_guarantee(tmp_path: Any, guarantee: str) -> None:
    """Faust's standby replicas were seen to skip changelog records while their offset moved
    past them (the fetch defect, worked around by ``fetch_only_active``); the worker kept
    none under ``exactly_once`` until that was measured again. It keeps one under both
    guarantees, so a takeover has the partition at hand."""
    from botmesh.providers.mock import MockProvider
    from botmesh.streams.config import WorkerConfig
    from botmesh.streams.faust_app.app import build_app
    from tests.kafka.bot import bot

    env = {"BOTMESH_DATA_DIR": str(tmp_path), "BOTMESH_PROCESSING_GUARANTEE": guarantee}
    app = build_app(bot, MockProvider(), WorkerConfig.from_env(env))
    assert app.conf.table_standby_replicas == 1


async def test_faust_sleeps_a_second_before_its_restore_and_the_worker_does_not() -> None:
    """Faust's table manager waits 1 s at its start before it subscribes the changelogs and
    starts the restore: a restart pays it before its first reply. ``start_tables_at_once``
    does the same two steps at once."""
    import inspect
    from types import SimpleNamespace

    from faust.tables.manager import TableManager

    from botmesh.streams.faust_app.defects import _ORIGINAL_TABLES_START, start_tables_at_once

    assert "await self.sleep(1.0)" in inspect.getsource(_ORIGINAL_TABLES_START)
    start_tables_at_once()
    steps: list[str] = []

    async def step(name: str) -> None:
        steps.append(name)

    async def sleep(seconds: float) -> None:
        raise AssertionError(f"slept {seconds} s")

    manager = SimpleNamespace(
        should_stop=False,
        sleep=sleep,
        _update_channels=lambda: step("channels"),
        recovery=SimpleNamespace(start=lambda: step("recovery")),
    )
    await TableManager.on_start(manager)  # type: ignore[arg-type]
    assert steps == ["channels", "recovery"]
    manager.should_stop = True  # stopped before it started: neither
    await TableManager.on_start(manager)  # type: ignore[arg-type]
    assert steps == ["channels", "recovery"]


async def test_faust_fetches_with_a_wait_of_1_5_s_and_the_worker_with_a_tenth(
    tmp_path: Any,
) -> None:
    """Faust creates its consumer with a hard-coded fetch wait of 1.5 s; a request to the
    broker behind a fetch of a quiet partition (the restore's ``ListOffsets``) waits for it.
    With ``short_fetch_wait`` (the worker installs it) the consumer Faust creates waits
    ``FETCH_WAIT_MS``."""
    import inspect

    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    from botmesh.providers.mock import MockProvider
    from botmesh.streams.config import WorkerConfig
    from botmesh.streams.faust_app.app import build_app
    from botmesh.streams.faust_app.defects import _ORIGINAL_CREATE_CONSUMER, FETCH_WAIT_MS
    from tests.kafka.bot import bot

    assert "fetch_max_wait_ms=1500" in inspect.getsource(_ORIGINAL_CREATE_CONSUMER)
    env = {"BOTMESH_DATA_DIR": str(tmp_path), "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    app = build_app(bot, MockProvider(), WorkerConfig.from_env(env))
    thread = app.consumer._thread
    assert isinstance(thread, AIOKafkaConsumerThread)
    faust_own = _ORIGINAL_CREATE_CONSUMER(thread, app.transport)
    ours = thread._create_worker_consumer(app.transport)
    try:
        assert (faust_own._fetch_max_wait_ms, ours._fetch_max_wait_ms) == (1500, FETCH_WAIT_MS)
        assert FETCH_WAIT_MS <= 100
    finally:
        for consumer in (faust_own, ours):
            await consumer.stop()  # never started: closes its client
        thread.thread_loop.close()  # the consumer thread's own loop, never run


async def test_faust_starts_transactional_producers_one_by_one_and_the_worker_together() -> None:
    """Under ``exactly_once`` a producer taking over a killed worker's transactional id
    waits for the broker to abort the transaction left open; Faust starts an assignment's
    producers one after the other, so a restart waited for the sum.
    ``start_producers_at_once`` starts them together."""
    import asyncio
    import inspect
    from types import SimpleNamespace

    from faust.transport.consumer import TransactionManager

    from botmesh.streams.faust_app.defects import (
        _ORIGINAL_START_TRANSACTIONS,
        start_producers_at_once,
    )

    source = inspect.getsource(_ORIGINAL_START_TRANSACTIONS)
    assert "for transactional_id in tids:" in source  # Faust's own: one await per id
    start_producers_at_once()
    running: set[str] = set()
    most = 0
    begun: list[str] = []

    async def maybe_begin_transaction(tid: str) -> None:
        nonlocal most
        running.add(tid)
        most = max(most, len(running))
        await asyncio.sleep(0.01)  # the broker aborting the predecessor's transaction
        running.discard(tid)
        begun.append(tid)

    manager = SimpleNamespace(
        producer=SimpleNamespace(maybe_begin_transaction=maybe_begin_transaction)
    )
    tids = [f"app-1-{p}" for p in range(4)]
    await TransactionManager._start_transactions(manager, tids)  # type: ignore[arg-type]
    assert sorted(begun) == tids
    assert most == 4  # all four begun before any finished


async def test_an_emptied_set_of_active_partitions_fetches_every_partition_unless_guarded() -> None:
    """Faust hands the consumer's thread its live set of active partitions; the event loop
    can empty it before the thread reads it (the end of a restore pauses the restored
    partitions), and aiokafka's ``fetched_records`` takes an empty set for every assigned
    partition: records of paused partitions come back and Faust drops them, past the
    consumer's position (a standby replica lost its backlog). With ``fetch_only_active``
    the thread tests each partition against the live set as it is then, never "every
    partition", and nothing is fetched while no partition is active."""
    import inspect
    from types import SimpleNamespace

    from aiokafka.consumer.fetcher import Fetcher
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    from botmesh.streams.faust_app.defects import _ORIGINAL_GETMANY, fetch_only_active

    assert "if partitions and tp not in partitions:" in inspect.getsource(Fetcher.fetched_records)
    assert "active_partitions," in inspect.getsource(_ORIGINAL_GETMANY)  # handed on as is
    changelog = TP("t.changelog", 1)
    live = {TPX, changelog}

    def drained(partitions: Any) -> set[Any]:
        # what aiokafka's fetched_records returns of records buffered for both partitions
        return {tp for tp in (TPX, changelog) if not (partitions and tp not in partitions)}

    got: list[set[Any]] = []

    async def call_thread(fun: Any, consumer: Any, partitions: Any, **kwargs: Any) -> Any:
        live.clear()  # the loop pauses them all before the thread reads the set
        got.append(drained(partitions))
        return {}

    thread = SimpleNamespace(_ensure_consumer=lambda: SimpleNamespace(_max_poll_records=500))
    thread.call_thread = call_thread
    thread._fetch_records = None
    await _ORIGINAL_GETMANY(thread, live, 1.0)
    assert got == [{TPX, changelog}]  # the defect: both, though neither is active any more
    fetch_only_active()
    live.update({TPX, changelog})
    await AIOKafkaConsumerThread.getmany(thread, live, 1.0)  # type: ignore[arg-type]
    assert got[1:] == [set()]  # neither: they were paused before the thread read the set
    assert await AIOKafkaConsumerThread.getmany(thread, live, 1.0) == {}  # type: ignore[arg-type]
    assert len(got) == 2  # none active: nothing fetched
    await AIOKafkaConsumerThread.getmany(thread, None, 1.0)  # type: ignore[arg-type]
    assert got[2:] == [{TPX, changelog}]  # a client-only app: every partition, as Faust meant


async def test_the_end_of_faust_restore_clears_the_changelog_queue_and_the_worker_keeps_it() -> (
    None
):
    """At the end of a rebalance Faust starts the standby replicas (their records are
    fetched into the changelog queue), then resumes the flow once more, which clears every
    queue flow control manages: standby records not yet applied would be dropped, the
    consumer's position past them. With ``keep_changelog_queue`` that last resume leaves
    the changelog queue as it is; the streams' queues are still cleared.

    Faust also resumes the stream partitions *before* it seeks them to their committed
    offsets: records fetched from the old positions meanwhile reach the streams' queues,
    the clear drops them, and the consumer's position is past them (the kill test: 0-8
    records per run skipped so, each caught by the guards and read again). The worker
    resumes them at the clear, after the seek."""
    from types import SimpleNamespace

    from faust.tables.recovery import Recovery
    from mode.utils.queues import FlowControlEvent, FlowControlQueue

    from botmesh.streams.faust_app.defects import _ORIGINAL_RECOVERY_COMPLETED, keep_changelog_queue

    steps: list[str] = []

    class Queue(FlowControlQueue[int]):
        def clear(self) -> None:
            steps.append(f"clear {self.name}")
            super().clear()

        name = ""

    async def run(on_recovery_completed: Any) -> tuple[int, int]:
        steps.clear()
        flow = FlowControlEvent()
        changelog = Queue(flow_control=flow, clear_on_resume=True)
        stream = Queue(flow_control=flow, clear_on_resume=True)
        changelog.name, stream.name = "changelog", "stream"
        flow.resume()
        steps.clear()
        for n in range(3):  # standby records fetched, not yet applied; a stream's records
            changelog.put_nowait(n)
            stream.put_nowait(n)

        async def done(*args: Any, **kwargs: Any) -> None:
            return None

        async def seek() -> None:
            steps.append("seek")

        async def wait(coro: Any, **kwargs: Any) -> Any:
            return await coro

        consumer = SimpleNamespace(
            assignment=lambda: {TPX},
            resume_partitions=lambda tps: steps.append(f"resume {sorted(tps)}"),
            perform_seek=seek,
            resume_flow=lambda: None,
        )
        app = SimpleNamespace(
            consumer=consumer,
            consumer_generation_id=7,
            on_rebalance_complete=SimpleNamespace(send=done),
            conf=SimpleNamespace(broker_request_timeout=1.0),
            flow_control=flow,
            _fetcher=SimpleNamespace(maybe_start=done),
            assignor=SimpleNamespace(assigned_standbys=lambda: {TP("t.changelog", 1)}),
            on_rebalance_end=lambda: None,
        )
        noop = SimpleNamespace(info=lambda *a: None, dev=lambda *a: None)
        me = SimpleNamespace(
            app=app,
            log=noop,
            tables=SimpleNamespace(
                values=list,
                changelog_queue=changelog,
                on_actives_ready=lambda: None,
                on_standbys_ready=lambda: None,
            ),
            _set_recovery_ended=lambda: None,
            _is_changelog_tp=lambda tp: False,
            _wait=wait,
            completed=SimpleNamespace(set=lambda: None),
            actives_for_table={},
            standbys_for_table={},
        )
        await on_recovery_completed(me, 7)
        assert "resume_partitions" in vars(consumer)  # the consumer as it was
        return changelog.qsize(), stream.qsize()

    resumed = f"resume {[TPX]}"
    assert await run(_ORIGINAL_RECOVERY_COMPLETED) == (0, 0)  # the defect: both cleared
    # resumed first, then sought; the clear takes the queues in no set order (a WeakSet)
    assert steps[:2] == [resumed, "seek"]
    assert sorted(steps[2:]) == ["clear changelog", "clear stream"]
    keep_changelog_queue()
    assert await run(Recovery.on_recovery_completed) == (3, 0)  # the changelog's kept
    assert steps == ["seek", "clear stream", resumed]  # resumed once sought and cleared


def test_every_patch_is_in_the_register_with_its_test() -> None:
    """The worker installs its workarounds from one entry point (``install``): every
    installer of the module is in ``REGISTER``, and each entry names a test that exists
    (or none, said so: those are counted in the closing notes)."""
    import ast
    import inspect
    from pathlib import Path

    from botmesh.streams.faust_app import defects as faust_defects

    installers = {
        name
        for name, fn in vars(faust_defects).items()
        if inspect.isfunction(fn)
        and fn.__module__ == faust_defects.__name__
        and not name.startswith("_")
        and inspect.signature(fn).parameters == {}
        and "idempotent" in (fn.__doc__ or "")
    }
    registered = {w.name for w in faust_defects.REGISTER}
    assert installers == registered
    assert all(w.install is getattr(faust_defects, w.name) for w in faust_defects.REGISTER)
    root = Path(__file__).resolve().parents[2]
    for w in faust_defects.REGISTER:
        if w.test is None:
            continue
        path, _, function = w.test.partition("::")
        tree = ast.parse((root / path).read_text())
        defined = {
            node.name
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        assert function in defined, f"{w.name}: no test {w.test}"
