"""The worker's journal changelog on librdkafka (``botmesh.streams.worker``), on a real broker:
the producer's partitioner against Java's (its murmur2 and its own producer), an ack written
to the partition's database, a lost record, a fenced transactional producer, aborted and open
transactions met by a restore, a restore resumed from its database's offset, consumer offsets
committed in the journal's transaction, and the restore's speed.
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, IsolationLevel, KafkaError, Message, Producer, TopicPartition

from botmesh.state.errors import FencedError, JournalUnavailableError
from botmesh.state.kv import Entry, Put
from botmesh.streams.config import WorkerConfig
from botmesh.streams.journal_db import JournalDb, encode_entry
from botmesh.streams.table_kv import TableKv, in_partition
from botmesh.streams.worker.changelog import ProducerFencedError, RdChangelog
from botmesh.streams.worker.clients import (
    consumer_config,
    producer_config,
    transactional_id,
    worker_consumer_config,
    worker_producer_config,
)
from botmesh.streams.worker.restore import (
    high_watermarks,
    open_database,
    persisted_offset,
    restore,
)
from tests.kafka.broker import KAFKA_SH, create_topics, free_ports
from tests.kafka.rdkafka_probe import read_all
from tests.murmur2 import java_partition

pytestmark = pytest.mark.kafka


# -- helpers ---------------------------------------------------------------------------------


@pytest.fixture
def topic(kafka_bootstrap: str, topic_prefix: str) -> str:
    name = f"{topic_prefix}.journal-changelog"
    create_topics(kafka_bootstrap, [name], 2, config={"cleanup.policy": "compact"})
    return name


class Dbs:
    """Journal databases under a test's directory, closed at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.opened: list[JournalDb] = []

    def new(self, name: str = "") -> JournalDb:
        db = open_database(self.root / (name or uuid.uuid4().hex))
        self.opened.append(db)
        return db

    def close(self) -> None:
        for db in self.opened:
            db.db.close()


@pytest.fixture
def dbs(tmp_path: Path) -> Iterator[Dbs]:
    d = Dbs(tmp_path)
    yield d
    d.close()


@pytest.fixture
async def port(kafka_bootstrap: str, topic: str) -> AsyncIterator[RdChangelog]:
    p = RdChangelog(producer_config(kafka_bootstrap), topic)
    await p.start()
    yield p
    await p.stop()


def entry(key: str, n: int = 0, due: float | None = None) -> bytes:
    return encode_entry(Entry(key, {"n": n, "state": "pending"}, 1, due, 1e12))


def records(db: JournalDb) -> dict[str, Any]:
    return {e.key: e.value for e in db.scan("", ())}


def txn_producer(bootstrap: str, tid: str) -> Producer:
    p = Producer(producer_config(bootstrap, transactional_id=tid, transaction_timeout=60.0))
    p.init_transactions(30)
    return p


# -- the partitioner -----------------------------------------------------------------------


#: Keys a line of text can carry (what Java's console producer reads).
TEXT_KEYS = [
    *(f"chat-{i}".encode() for i in range(200)),
    *(f"scope%2F{i}/in/{uuid.UUID(int=i * 7919)}".encode() for i in range(100)),
    "чат-ünïcödé-💬".encode(),
    b"",
]
KEYS = [*TEXT_KEYS, *(os.urandom(n) for n in (1, 2, 3, 4, 5, 7, 8, 13, 64, 257) for _ in range(3))]


def _placed(bootstrap: str, topic: str, conf: dict[str, Any]) -> list[int]:
    """Where librdkafka's producer (``conf``) puts each of ``KEYS`` (from its reports)."""
    producer = Producer(conf)
    got: dict[int, int] = {}

    def report(i: int, err: KafkaError | None, msg: Message[Any, Any]) -> None:
        assert err is None, err
        partition = msg.partition()
        assert partition is not None
        got[i] = partition

    for i, key in enumerate(KEYS):
        producer.produce(topic, b"", key, on_delivery=functools.partial(report, i))
    assert producer.flush(30) == 0
    return [got[i] for i in range(len(KEYS))]


def _java_placed(bootstrap: str, topic: str, group: str, partitions: int) -> dict[bytes, int]:
    """Where Kafka's own Java producer (``kafka.sh tool console-producer``, its default
    partitioner, acks=all) puts each of ``TEXT_KEYS``, read back from the broker."""
    lines = "".join(f"{key.decode()}\t-\n" for key in TEXT_KEYS)
    done = subprocess.run(
        [
            str(KAFKA_SH),
            "tool",
            "console-producer",
            *("--bootstrap-server", bootstrap, "--topic", topic),
            *("--reader-property", "parse.key=true", "--request-required-acks", "-1"),
        ],
        input=lines.encode(),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    out: dict[bytes, int] = {}
    for m in read_all(bootstrap, group, topic, partitions):
        key, partition = m.key(), m.partition()
        assert isinstance(key, bytes) and partition is not None
        assert out.setdefault(key, partition) == partition
    assert sorted(out) == sorted(TEXT_KEYS)
    return out


def test_keys_land_where_java_puts_them(kafka_bootstrap: str, topic_prefix: str) -> None:
    """``partitioner=murmur2_random``: for every key and partition count, the partition
    Java's murmur2 (``tests/murmur2.py``) computes, and where Kafka's own Java producer put
    the record on the broker. librdkafka's default partitioner does not."""
    counts = (1, 2, 3, 5, 8, 12, 16, 31)
    topics = {n: f"{topic_prefix}.parts{n}" for n in counts}
    java_topic = f"{topic_prefix}.java12"
    for n, name in topics.items():
        create_topics(kafka_bootstrap, [name], n)
    create_topics(kafka_bootstrap, [java_topic], 12)
    for n, name in topics.items():
        expected = [java_partition(key, n) for key in KEYS]
        assert _placed(kafka_bootstrap, name, producer_config(kafka_bootstrap)) == expected, n
    # the setting matters: librdkafka's own default (CRC32) puts keys elsewhere
    default = {k: v for k, v in producer_config(kafka_bootstrap).items() if k != "partitioner"}
    eight = [java_partition(key, 8) for key in KEYS]
    assert _placed(kafka_bootstrap, topics[8], default) != eight
    # and where Java's producer put them on the broker (the keys a text line can carry)
    on_broker = _java_placed(kafka_bootstrap, java_topic, f"{topic_prefix}-java", 12)
    assert on_broker == {key: java_partition(key, 12) for key in TEXT_KEYS}  # so ours too
    assert len(set(on_broker.values())) == 12  # spread: a constant partition would pass nothing


def test_the_clients_settings() -> None:
    conf = producer_config("b:9092", transactional_id=transactional_id("grp", "shop/0"))
    assert conf["transactional.id"] == "grp.shop_0"
    assert (conf["acks"], conf["enable.idempotence"], conf["partitioner"]) == (
        "all",
        True,
        "murmur2_random",
    )
    assert conf["message.timeout.ms"] <= conf["transaction.timeout.ms"]
    consumer = consumer_config("b:9092", group="grp", instance_id="shop-0", session_timeout=30.0)
    assert consumer["group.instance.id"] == "shop-0"
    assert consumer["session.timeout.ms"] == 30000
    assert consumer["isolation.level"] == "read_committed"
    assert consumer["partition.assignment.strategy"] == "cooperative-sticky"
    assert consumer["enable.auto.commit"] is False
    assert consumer["enable.auto.offset.store"] is False
    dynamic = consumer_config("b:9092", group="grp", instance_id=None, session_timeout=10.0)
    assert "group.instance.id" not in dynamic
    worker = WorkerConfig(prefix="shop", instance_id="shop-1", session_timeout=12.0)
    assert worker_consumer_config(worker)["group.instance.id"] == "shop-1"
    assert worker_consumer_config(worker)["session.timeout.ms"] == 12000
    assert "transactional.id" not in worker_producer_config(worker, "shop-1")
    eos = WorkerConfig(prefix="shop", guarantee="exactly_once")
    assert worker_producer_config(eos, "shop-1")["transactional.id"] == "shop.worker.shop-1"


# -- at_least_once ----------------------------------------------------------------------------


async def test_an_acked_record_is_in_its_database_with_its_offset(
    port: RdChangelog, dbs: Dbs
) -> None:
    """Acks of one wake-up go to each partition's database in one batch with the offset of
    the last one (index entries included), before the awaitables resolve."""
    db0, db1 = dbs.new(), dbs.new()
    port.attach(0, db0)
    port.attach(1, db1)
    acks = [
        await port.produce(0, b"s/a", entry("s/a", 1, due=5.0)),
        await port.produce(1, b"s/b", entry("s/b", 2, due=3.0)),
        await port.produce(0, b"s/c", entry("s/c", 3, due=1.0)),
        await port.produce(0, b"s/a", None),  # a delete of s/a, after it
    ]
    offsets = await asyncio.gather(*acks)
    assert records(db0) == {"s/c": {"n": 3, "state": "pending"}}
    assert records(db1) == {"s/b": {"n": 2, "state": "pending"}}
    assert persisted_offset(db0) == max(offsets[0], offsets[2], offsets[3])
    assert persisted_offset(db1) == offsets[1]
    assert db0.range("due", "s/", 10.0, 10, ()) == [(1.0, "s/c")]  # s/a's entry went with it


async def test_a_journal_commit_is_persisted_when_acked(port: RdChangelog, dbs: Dbs) -> None:
    """Through the journal: a commit returns once acked, the record is then in RocksDB and
    the journal no longer holds it in memory (``TableKv.persisted``)."""
    db = dbs.new()
    port.attach(0, db)
    kv = port.kv = TableKv(port, ack_timeout=20.0, cache_size=0)
    await kv.open()
    await kv.assign([0])
    with in_partition(0):
        assert await kv.commit([Put("s/k", {"v": 1}, expect=0)]) == [1]
    got = db.get("s/k")
    assert got is not None and (got.value, got.version) == ({"v": 1}, 1)
    assert kv.in_memory == 0  # dropped from the overlay: read from the database
    with in_partition(0):
        assert await kv.get("s/k") == got


async def test_a_record_the_broker_never_acks_is_journal_unavailable(topic: str) -> None:
    """No broker at the address: the record's awaitable raises ``JournalUnavailableError``
    once its delivery timeout passed (not an exception of librdkafka's, not a hang)."""
    [nobody] = free_ports(1)
    port = RdChangelog(producer_config(f"127.0.0.1:{nobody}", delivery_timeout=2.0), topic)
    await port.start()
    try:
        ack = await port.produce(0, b"s/k", entry("s/k"))
        async with asyncio.timeout(60):  # a hang guard, far above the 2 s timeout
            with pytest.raises(JournalUnavailableError, match="not acked by the broker") as lost:
                await ack
        assert not isinstance(lost.value, FencedError)
        assert "_MSG_TIMED_OUT" in str(lost.value)
    finally:
        await port.stop(timeout=1.0)
    # exactly_once: the transactions cannot begin without the coordinator
    tid = producer_config(f"127.0.0.1:{nobody}", transactional_id="nobody.w-0")
    eos = RdChangelog(tid, topic, commit_timeout=2.0)
    async with asyncio.timeout(60):
        with pytest.raises(JournalUnavailableError, match="not initialised"):
            await eos.start()
        with pytest.raises(JournalUnavailableError, match="stopped"):
            await eos.produce(0, b"s/k", entry("s/k"))


# -- exactly_once ------------------------------------------------------------------------------


async def test_a_producer_fenced_by_its_successor_raises_fenced(
    kafka_bootstrap: str, topic: str, topic_prefix: str, dbs: Dbs
) -> None:
    """Two producers with one ``transactional.id`` (a worker restarted while its old
    incarnation still runs): the old one's records and commits raise ``FencedError``;
    only what it committed before is in the log."""
    tid = transactional_id(topic_prefix, "w-0")
    old = RdChangelog(producer_config(kafka_bootstrap, transactional_id=tid), topic)
    await old.start()
    new = RdChangelog(producer_config(kafka_bootstrap, transactional_id=tid), topic)
    try:
        db = dbs.new()
        old.attach(0, db)
        first = await old.produce(0, b"s/first", entry("s/first"))
        old.commit_soon([0])
        await first
        assert records(db) == {"s/first": {"n": 0, "state": "pending"}}
        await new.start()  # init_transactions: the old producer is fenced
        late = await old.produce(0, b"s/late", entry("s/late"))
        with pytest.raises(FencedError) as fenced:
            await old.commit()
        assert isinstance(fenced.value, ProducerFencedError)
        with pytest.raises(FencedError):
            await late
        with pytest.raises(FencedError):  # and every later record
            await old.produce(0, b"s/later", entry("s/later"))
        # the successor works
        ok = await new.produce(1, b"s/new", entry("s/new"))
        await new.commit()
        await ok
    finally:
        await old.stop(timeout=5.0)
        await new.stop()
    fresh = {0: dbs.new(), 1: dbs.new()}
    restore(kafka_bootstrap, topic, fresh)
    assert set(records(fresh[0])) == {"s/first"}
    assert set(records(fresh[1])) == {"s/new"}


async def test_only_committed_records_reach_the_database(
    kafka_bootstrap: str, topic: str, topic_prefix: str, dbs: Dbs
) -> None:
    """Under ``exactly_once`` a record's awaitable resolves at the commit of the worker's
    one transaction (every partition's records in it), and only then is it written to
    RocksDB; records produced during a commit go into the next."""
    tid = transactional_id(topic_prefix, "w-1")
    port = RdChangelog(producer_config(kafka_bootstrap, transactional_id=tid), topic)
    await port.start()
    try:
        d0, d1 = dbs.new(), dbs.new()
        port.attach(0, d0)
        port.attach(1, d1)
        a = await port.produce(0, b"s/a", entry("s/a"))
        b = await port.produce(1, b"s/b", entry("s/b"))
        assert not a.done() and records(d0) == {}
        commit = asyncio.ensure_future(port.commit())
        await asyncio.sleep(0)  # one turn: the commit takes the transaction
        assert port.committing
        c = await port.produce(0, b"s/c", entry("s/c"))  # waits for the commit to end
        await asyncio.gather(a, b, commit)
        assert set(records(d0)) == {"s/a"} and set(records(d1)) == {"s/b"}
        assert not c.done()
        port.commit_soon([0], delay=0.01)  # the journal's lazy commit
        await c
        assert set(records(d0)) == {"s/a", "s/c"}
        assert port.commits == 2
    finally:
        await port.stop()
    # the databases hold the offset of their last record; the commit marker after it is
    # read past (the position passes it) and nothing is restored twice
    again = restore(kafka_bootstrap, topic, {0: d0, 1: d1}, timeout=60)
    assert [again[p].records for p in (0, 1)] == [0, 0]
    assert [persisted_offset(d) for d in (d0, d1)] == [again[0].end - 1, again[1].end - 1]


async def test_consumer_offsets_commit_with_the_journal_records(
    kafka_bootstrap: str, topic: str, topic_prefix: str, dbs: Dbs
) -> None:
    """``send_offsets``: the inbound offsets go into the journal's open transaction and
    commit with its records (EOS v2, the consumer's group metadata); a transaction that
    does not commit (its producer fenced) commits neither."""
    inbound = f"{topic_prefix}.inbound"
    create_topics(kafka_bootstrap, [inbound], 1)
    plain = Producer(producer_config(kafka_bootstrap))
    for i in range(4):
        plain.produce(inbound, f"m{i}".encode(), b"chat")
    assert plain.flush(30) == 0
    group = f"{topic_prefix}.workers"
    consumer = Consumer(
        consumer_config(kafka_bootstrap, group=group, instance_id=None, session_timeout=10.0)
    )
    consumer.subscribe([inbound])
    tid = transactional_id(group, "w-0")
    port = RdChangelog(producer_config(kafka_bootstrap, transactional_id=tid), topic)
    await port.start()
    successor = RdChangelog(producer_config(kafka_bootstrap, transactional_id=tid), topic)
    try:
        got: list[Message[Any, Any]] = []
        deadline = time.monotonic() + 60
        while len(got) < 4 and time.monotonic() < deadline:
            got.extend(m for m in consumer.consume(4, 0.5) if m.error() is None)
        assert len(got) == 4
        tp = TopicPartition(inbound, 0)
        # transaction 1: a journal record and the offset after the second inbound
        j1 = await port.produce(0, b"s/j1", entry("s/j1"))
        await port.send_offsets([TopicPartition(inbound, 0, 2)], consumer.consumer_group_metadata())
        await port.commit()
        await j1
        [committed] = consumer.committed([tp], 30)
        assert committed.offset == 2
        # transaction 2: a record and the offset 4, then the producer is fenced
        j2 = await port.produce(0, b"s/j2", entry("s/j2"))
        await port.send_offsets([TopicPartition(inbound, 0, 4)], consumer.consumer_group_metadata())
        await successor.start()
        with pytest.raises(FencedError):
            await port.commit()
        with pytest.raises(FencedError):
            await j2
        [committed] = consumer.committed([tp], 30)
        assert committed.offset == 2  # neither the offsets nor the record
    finally:
        consumer.close()
        await port.stop(timeout=5.0)
        await successor.stop()
    fresh = {0: dbs.new()}
    restore(kafka_bootstrap, topic, fresh)
    assert set(records(fresh[0])) == {"s/j1"}


# -- the restore -------------------------------------------------------------------------------


def test_records_of_aborted_transactions_are_never_restored(
    kafka_bootstrap: str, topic: str, topic_prefix: str, dbs: Dbs
) -> None:
    """Read ``read_committed``: aborted records never reach the database, and a log that
    ends with an aborted transaction (its marker last) does not hang the restore."""
    p = txn_producer(kafka_bootstrap, f"{topic_prefix}.writer")
    for keys, commit in ((["c1", "c2"], True), (["a1", "a2", "c1"], False), (["c3"], True)):
        p.begin_transaction()
        for k in keys:
            p.produce(topic, entry(k, 9 if not commit else 0), k.encode(), 0)
        if commit:
            p.commit_transaction(30)
        else:
            assert p.flush(30) == 0  # in the log, then aborted
            p.abort_transaction(30)
    p.begin_transaction()
    p.produce(topic, entry("a3"), b"a3", 0)
    assert p.flush(30) == 0
    p.abort_transaction(30)  # the log ends with an abort marker
    db = dbs.new()
    done = restore(kafka_bootstrap, topic, {0: db}, timeout=60)
    assert set(records(db)) == {"c1", "c2", "c3"}
    assert records(db)["c1"]["n"] == 0  # the aborted rewrite of c1 is not there
    assert done[0].records == 3
    [end] = high_watermarks(kafka_bootstrap, topic, [0]).values()
    assert done[0].end == end and persisted_offset(db) == end - 1  # markers counted as read


async def test_a_restore_reaches_records_committed_behind_an_open_transaction(
    kafka_bootstrap: str, topic: str, topic_prefix: str, dbs: Dbs
) -> None:
    """The last-stable-offset trap: a crashed writer's transaction is still open (A) and
    another producer committed records after it (B). A restore bounded by the
    ``read_committed`` end offset (the LSO) would end early and miss B's records; bounded by
    the high watermark it cannot end while A is open, and after A's successor aborted A,
    it has B's records and none of A's."""
    a = txn_producer(kafka_bootstrap, f"{topic_prefix}.a")
    a.begin_transaction()
    a.produce(topic, entry("a1"), b"a1", 0)
    assert a.flush(30) == 0  # in the log, its transaction open
    b = txn_producer(kafka_bootstrap, f"{topic_prefix}.b")
    b.begin_transaction()
    for k in ("b1", "b2"):
        b.produce(topic, entry(k), k.encode(), 0)
    b.commit_transaction(30)
    lso = high_watermarks(kafka_bootstrap, topic, [0], isolation=IsolationLevel.READ_COMMITTED)
    high = high_watermarks(kafka_bootstrap, topic, [0])
    assert lso[0] < high[0]  # B's records are past the last stable offset
    # the wrong bound ends "done" without B's records: this is what must not happen
    short = dbs.new()
    restore(kafka_bootstrap, topic, {0: short}, bound=IsolationLevel.READ_COMMITTED)
    assert records(short) == {}
    # the restore's own bound: while A is open it cannot claim to be done
    waiting = dbs.new()
    with pytest.raises(JournalUnavailableError, match="not done in time"):
        await asyncio.to_thread(restore, kafka_bootstrap, topic, {0: waiting}, timeout=10.0)
    # A's successor (same transactional id) aborts A at its start
    txn_producer(kafka_bootstrap, f"{topic_prefix}.a")
    db = dbs.new()
    done = restore(kafka_bootstrap, topic, {0: db}, timeout=60)
    assert set(records(db)) == {"b1", "b2"}
    assert done[0].records == 2


def test_a_restore_reads_only_what_follows_the_database_offset(
    kafka_bootstrap: str, topic: str, dbs: Dbs
) -> None:
    plain = Producer(producer_config(kafka_bootstrap))
    for i in range(10):
        plain.produce(topic, entry(f"k{i}", i), f"k{i}".encode(), 1)
    assert plain.flush(30) == 0
    db = dbs.new()
    first = restore(kafka_bootstrap, topic, {1: db})[1]
    assert (first.start, first.records, first.end) == (0, 10, 10)
    assert persisted_offset(db) == 9
    for i in range(10, 15):
        plain.produce(topic, entry(f"k{i}", i), f"k{i}".encode(), 1)
    plain.produce(topic, None, b"k0", 1)  # a tombstone
    assert plain.flush(30) == 0
    again = restore(kafka_bootstrap, topic, {1: db})[1]
    assert (again.start, again.records, again.end) == (10, 6, 16)
    assert len(records(db)) == 14 and "k0" not in records(db)
    assert db.range("purge", "k", 2e12, 100, ()) == sorted(
        (1e12, k) for k in records(db)
    )  # index entries written with the records
    nothing = restore(kafka_bootstrap, topic, {1: db})[1]
    assert (nothing.start, nothing.records) == (16, 0)


async def test_a_partition_written_through_the_port_restores_nothing_again(
    port: RdChangelog, kafka_bootstrap: str, topic: str, dbs: Dbs
) -> None:
    """The port records the offset of what it wrote: a restart on the same database reads
    nothing that is already there."""
    db = dbs.new()
    port.attach(0, db)
    acks = [await port.produce(0, f"s/{i}".encode(), entry(f"s/{i}")) for i in range(20)]
    await asyncio.gather(*acks)
    again = restore(kafka_bootstrap, topic, {0: db})[0]
    assert again.records == 0 and again.start == again.end


RESTORE_RECORDS = 100_000


def test_restore_speed(kafka_bootstrap: str, topic_prefix: str, dbs: Dbs) -> None:
    """Restore 100,000 journal records (one partition) into an empty database; prints the
    rate (no assertion on time: the machine is shared)."""
    name = f"{topic_prefix}.speed"
    create_topics(kafka_bootstrap, [name], 1, config={"cleanup.policy": "compact"})
    producer = Producer({**producer_config(kafka_bootstrap), "linger.ms": 50})
    for i in range(RESTORE_RECORDS):
        key = f"bot/out/{i:08}"
        producer.produce(name, entry(key, i, due=float(i)), key.encode(), 0)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    db = dbs.new()
    started = time.perf_counter()
    done = restore(kafka_bootstrap, name, {0: db}, timeout=300)
    took = time.perf_counter() - started
    assert done[0].records == RESTORE_RECORDS
    assert persisted_offset(db) == RESTORE_RECORDS - 1
    print(f"\nrestore: {RESTORE_RECORDS} records in {took:.2f}s: {RESTORE_RECORDS / took:,.0f}/s")
