"""The librdkafka facts the confluent-kafka runtime relies on (issue 38), each shown on a
real Apache Kafka broker (4.4.0, ``deploy/kafka/kafka.sh``) with confluent-kafka 2.16.2 and
librdkafka 2.16.0. ``REGISTER`` (at the end) lists them, one test a row. The table says what
/work/shared/notes/librdkafka-runtime.md (written from the 2.15.0 sources) claimed and what
these tests saw; CORRECTED marks where the notes are wrong for 2.16.

===================  ======================  ===============================  ======================
fact                 the notes said          what we saw                      test
===================  ======================  ===============================  ======================
AIO module of 2.16   confluent_kafka.aio:    as said, plus                    test_the_aio_module_
                     AIOProducer,            AsyncSerializingProducer and     of_2_16
                     AIOConsumer (2.15.0).   AsyncDeserializingConsumer.
                     AIOConsumer: 2          CORRECTED for AIOConsumer: 100
                     workers,                workers by default,
                     get_event_loop(); a     get_running_loop() (built
                     callback's re-entrant   outside a loop: RuntimeError),
                     call needs a free       calls on one consumer
                     worker, may deadlock    serialized and a callback's
                     (CKP #2322)             re-entrant call let through
                                             (ReentryContext: the #2322 gate
                                             landed). AIOProducer unchanged
                                             (4 workers, batch 1000, 1.0 s)
await produce()      buffered until          as said: right after produce()   test_a_lone_aio_
gives a future; the  flush(), 1000           the record is in the Python      produce_stays_in_the_
record waits in a    messages, or 1 s with   buffer, librdkafka's queue is    python_buffer_until_
Python buffer        no produce              empty, the future pending;       flush
                                             flush() empties both and
                                             resolves it
a lone produce, no   delivered after the 1   CORRECTED: 2.5 s here. The       test_without_flush_a_
flush()              s inactivity timer      timer (checked every 0.5 s)      lone_aio_produce_is_
                                             hands it to librdkafka after     delivered_by_the_
                                             1-1.5 s with flush(0), too soon  buffer_timer
                                             for its delivery report; the
                                             report is served at the timer's
                                             next firing, >= 1 s later
                                             (times recorded with
                                             record_property)
a trickle of         can stay buffered       as said: a produce every 0.2 s   test_a_steady_trickle_
produces                                     for 2 s, nothing reaches         of_aio_produces_never_
                                             librdkafka                       leaves_the_buffer
timestamp= /         headers raise;          CORRECTED: headers raise         test_an_aio_produce_
headers= on AIO      timestamp fails the     NotImplementedError at           with_a_timestamp_
produce              batch at flush          produce(); a timestamp fails     poisons_every_later_
                                             its flush and the batch goes     flush_until_purge
                                             back into the buffer, so every
                                             later flush fails (innocent
                                             records with it) until purge()
partitioner          default                 as said, on the broker: the      test_the_default_
                     consistent_random       default puts a key at            partitioner_differs_
                     (CRC32) differs from    crc32(key) % n (most keys        from_java_and_
                     Java's murmur2;         elsewhere than Java's);          murmur2_random_matches
                     murmur2_random matches  murmur2_random puts every key
                                             where Java's murmur2
                                             (tests/murmur2.py) does
cooperative-sticky,  incremental lists;      as said: the owner gets          test_cooperative_
sync Consumer        on_assign once per      on_revoke(moved ones only) and   sticky_moves_only_
                     rebalance even if       on_assign([]) in each of the     some_partitions_with_
                     empty; a joiner moves   two rebalances, the joiner       incremental_callbacks
                     only some;              on_assign([]) then
                     rebalance_protocol()    on_assign(moved); kept
                     says COOPERATIVE        partitions read on, never
                                             re-read. CORRECTED: the Python
                                             Consumer has no
                                             rebalance_protocol() (C API
                                             only); the group describes as
                                             cooperative-sticky
static member        old assignment back,    as said (the restarted member    test_a_static_member_
closed, restarted    no rebalance            was the group's leader): its     restarted_in_time_
in the session                               partitions back, the other       gets_its_partitions_
                                             member sees no callback and      back_without_a_
                                             keeps its member id              rebalance[close]
static member:       unsubscribe() sends     CORRECTED: only if the revoke    test_a_static_member_
unsubscribe() then   LeaveGroup (code        is served before close().        restarted_in_time_
close()              reading)                unsubscribe() and close() at     gets_its_partitions_
                                             once send none (the unassign     back_without_a_
                                             ends during termination, when    rebalance[unsubscribe-
                                             librdkafka skips a static        then-close]
                                             member's leave); polled until    test_a_static_member_
                                             on_revoke ran, it leaves at      leaves_at_once_when_
                                             once                             its_unsubscribe_is_
                                                                              polled_before_close
static member        (session.timeout.ms)    its partitions move once its     test_a_closed_static_
closed, not                                  session expired: 5.9-6.4 s       members_partitions_
restarted                                    after close() with a 6 s         move_after_the_
                                             session                          session_timeout
EOS v2: offsets in   offsets and records     as said: an aborted transaction  test_offsets_sent_to_
the transaction      commit together         commits neither its records nor  a_transaction_commit_
                                             its offsets, a committed one     and_abort_with_its_
                                             both                             records
zombie's group       abortable               as said:                         test_stale_group_
metadata             (ILLEGAL_GENERATION,    send_offsets_to_transaction      metadata_is_an_
                     UNKNOWN_MEMBER_ID)      itself raises,                   abortable_error
                                             ILLEGAL_GENERATION (older
                                             generation) or
                                             UNKNOWN_MEMBER_ID (member
                                             left); txn_requires_abort()
                                             set, fatal() and retriable()
                                             not; after abort the producer
                                             commits again
same                 fatal _FENCED;          as said: the new producer's      test_a_second_
transactional.id     init_transactions       init_transactions returns with   producer_with_the_
                     aborts the open         the old transaction aborted      same_transactional_id_
                     transaction             (LSO past it); the old           fences_the_first
                                             producer's next flush() and
                                             commit_transaction() raise
                                             _FENCED, fatal();
                                             read_committed readers see none
                                             of its records
watermarks under an  read_committed          as said: get_watermark_offsets   test_a_read_committed_
open transaction     watermark is the LSO    under read_committed (the        watermark_is_the_last_
                                             default) and list_offsets        stable_offset
                                             READ_COMMITTED give the LSO,
                                             below records committed after
                                             the open transaction began;
                                             read_uncommitted /
                                             READ_UNCOMMITTED the high
                                             watermark
one sync Consumer,   (not covered; the       CORRECTED/new: a call from a     test_a_call_from_
two threads          #2322 thread gate was   second thread (assignment(),     another_thread_waits_
                     only a PR after 2.15)   commit()) waits until the first  for_a_running_consume
                                             thread's running consume()
                                             returns
one AIOConsumer,     a re-entrant call       CORRECTED: calls are serialized  test_an_aio_consumer_
two tasks            needs a free pool       (a second task's call waits for  serializes_its_calls_
                     worker; can deadlock    a running consume()); an async   but_admits_its_
                                             def callback's own call is       callbacks_calls
                                             admitted at once (assignment()
                                             inside on_assign is still [])
rebalance            only inside             as said: on the thread calling   test_rebalance_
callbacks' thread    poll()/consume()        poll()/consume(), inside that    callbacks_run_inside_
                                             call                             poll_or_consume_on_
                                                                              the_calling_thread
co-partitioning     (not covered: the       new: subscribed to the inbound   test_a_partition_of_
beside the           notes' runtimes use     topic only, a member that adds   another_topic_goes_
cooperative          Faust's assignor or     the same partitions of a second  and_comes_with_the_
assignor             range)                  topic in its callbacks           subscribed_one
                                             (incremental_assign/unassign)
                                             fetches and commits them, and
                                             they move with the subscribed
                                             ones when a member joins
===================  ======================  ===============================  ======================

Corrections the runtime must follow:

- call ``flush()`` (or commit the transaction) at every checkpoint: a lone AIO produce is
  otherwise delivered 2-2.5 s later, and a trickle never leaves the Python buffer;
- never pass ``timestamp=`` to ``AIOProducer.produce`` (it poisons the buffer until
  ``purge()``; headers are refused outright): use the sync ``Producer`` where either is needed;
- a static member that means to leave calls ``unsubscribe()`` and polls until its
  ``on_revoke`` ran, then ``close()``; ``close()`` alone (a restart) keeps the assignment;
- the protocol follows from ``partition.assignment.strategy`` (no ``rebalance_protocol()``);
- one consumer, one caller at a time: a ``commit()`` or ``assignment()`` from another
  thread (sync) or task (AIO) waits for a running ``consume()``, so keep consume timeouts
  short or drive the consumer from one thread; a rebalance callback's own calls are admitted;
- cooperative-sticky does not co-partition two topics: subscribe to the inbound topic only
  and add (and remove) the same partitions of the requests and control topics in the
  rebalance callbacks, so a chat's records of every topic go to its journal's owner;
- ``commit_transaction()`` returns before the markers are on the partitions: a
  read_committed watermark read right after it can still be the old LSO (15 of 30 commits
  in a probe here; a race, so not a row: the tests here wait for the LSO, ``settle``).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec

from tests.kafka.broker import create_topics
from tests.kafka.rdkafka_probe import (
    DEADLINE_S,
    TP,
    Member,
    produce,
    pump,
    read_all,
    settle,
    tps,
    wait_until,
)
from tests.murmur2 import java_partition

pytestmark = pytest.mark.kafka


@pytest.fixture
def members() -> Iterator[list[Member]]:
    """Members a test makes; each is closed after it (a no-op for those it closed)."""
    made: list[Member] = []
    yield made
    for m in made:
        m.close()


@pytest.fixture
def admin(kafka_bootstrap: str) -> AdminClient:
    # held by the test: a client collected early fails (or never completes) its futures
    return AdminClient({"bootstrap.servers": kafka_bootstrap, "log_level": 3})


def join(members: list[Member], *args: Any, **kw: Any) -> Member:
    m = Member(*args, **kw)
    members.append(m)
    return m


def group_members(admin: AdminClient, group: str) -> dict[str | None, str]:
    """``{group.instance.id: member id}`` of ``group`` as its coordinator describes it."""
    desc = admin.describe_consumer_groups([group])[group].result(DEADLINE_S)
    return {m.group_instance_id: m.member_id for m in desc.members}


def txn_producer(bootstrap: str, txn_id: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "log_level": 3})


def raised(call: Any, *args: Any) -> KafkaError:
    """The ``KafkaError`` that ``call(*args)`` raises (the test fails when it does not)."""
    with pytest.raises(KafkaException) as info:
        call(*args)
    err = info.value.args[0]
    assert isinstance(err, KafkaError)
    return err


# ------------------------------------------------------------------ 1. confluent_kafka.aio


def test_the_aio_module_of_2_16() -> None:
    import confluent_kafka
    from confluent_kafka import aio
    from confluent_kafka.aio import AIOConsumer, AIOProducer, _common

    # (cimpl.pyi types version() as a (str, int) tuple; 2.16.2 returns the str)
    assert str(confluent_kafka.__version__) == "2.16.2"
    assert confluent_kafka.libversion()[0] == "2.16.0"
    assert set(aio.__all__) == {
        "AIOConsumer",
        "AIOProducer",
        "AsyncDeserializingConsumer",
        "AsyncSerializingProducer",
    }
    consumer_args = inspect.signature(AIOConsumer.__init__).parameters
    assert consumer_args["max_workers"].default == 100  # the notes (2.15.0): 2
    producer_args = inspect.signature(AIOProducer.__init__).parameters
    assert producer_args["max_workers"].default == 4
    assert producer_args["batch_size"].default == 1000
    assert producer_args["buffer_timeout"].default == 1.0
    # the loop is taken with get_running_loop() (the notes: get_event_loop() in AIOConsumer)
    with pytest.raises(RuntimeError, match="no running event loop"):
        AIOConsumer({"group.id": "never-used"})
    # the per-consumer gate of CKP #2322: calls serialized, a callback's call let through
    assert hasattr(_common, "ReentryContext")
    assert "serialized" in (AIOConsumer.__doc__ or "")


async def test_a_lone_aio_produce_stays_in_the_python_buffer_until_flush(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    from confluent_kafka.aio import AIOProducer

    topic = f"{topic_prefix}.aio"
    create_topics(kafka_bootstrap, [topic])
    producer = AIOProducer({"bootstrap.servers": kafka_bootstrap, "log_level": 3})
    try:
        await producer.list_topics(topic)  # connected: the wait below is not a connect
        fut = await producer.produce(topic, value=b"lone")
        assert isinstance(fut, asyncio.Future)  # a second await gives the delivery
        assert not fut.done()
        assert producer._batch_processor.get_buffer_size() == 1  # in the Python buffer
        assert len(producer._producer) == 0  # librdkafka has nothing yet
        assert len(producer) == 1
        await producer.flush()
        assert fut.done()
        msg = await fut
        assert (msg.topic(), msg.partition(), msg.offset()) == (topic, 0, 0)
        assert producer._batch_processor.get_buffer_size() == 0
        assert len(producer._producer) == 0
    finally:
        await producer.close()


async def test_without_flush_a_lone_aio_produce_is_delivered_by_the_buffer_timer(
    kafka_bootstrap: str, topic_prefix: str, record_property: Any
) -> None:
    """No flush, no further produce: the inactivity timer hands the record over; its
    delivery report waits for the timer's next ``flush(0)``. The times are recorded, not
    asserted."""
    from confluent_kafka.aio import AIOProducer

    topic = f"{topic_prefix}.aio"
    create_topics(kafka_bootstrap, [topic])
    producer = AIOProducer({"bootstrap.servers": kafka_bootstrap, "log_level": 3})
    try:
        await producer.list_topics(topic)
        t0 = time.monotonic()
        fut = await producer.produce(topic, value=b"lone")
        handed_over: float | None = None
        while not fut.done():
            buffered = producer._batch_processor.get_buffer_size()
            if buffered == 0 and handed_over is None:
                handed_over = time.monotonic() - t0
            assert time.monotonic() - t0 < DEADLINE_S, "the timer never delivered it"
            await asyncio.sleep(0.01)
        delivered = time.monotonic() - t0
        if handed_over is None:  # both came between two looks (a loaded machine's loop)
            handed_over = delivered
        # it left the Python buffer (by the time it was delivered at the latest)
        assert producer._batch_processor.get_buffer_size() == 0
        msg = fut.result()
        assert msg.offset() == 0
        record_property("aio_lone_handover_s", round(handed_over, 3))
        record_property("aio_lone_delivery_s", round(delivered, 3))
        print(
            f"lone AIO produce: handed to librdkafka after {handed_over:.2f} s, "
            f"delivered after {delivered:.2f} s"
        )
    finally:
        await producer.close()


async def test_a_steady_trickle_of_aio_produces_never_leaves_the_buffer(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """A produce every 0.2 s for 2 s (twice ``buffer_timeout``): nothing reaches librdkafka.
    A round in which the loop itself stalled ≥ 1 s between two produces proves nothing and
    is run again (at most 3 rounds)."""
    from confluent_kafka.aio import AIOProducer

    topic = f"{topic_prefix}.aio"
    create_topics(kafka_bootstrap, [topic])
    producer = AIOProducer({"bootstrap.servers": kafka_bootstrap, "log_level": 3})
    try:
        await producer.list_topics(topic)
        for _round in range(3):
            futs = []
            gaps = []
            last = time.monotonic()
            start = last
            while time.monotonic() - start < 2.0:
                futs.append(await producer.produce(topic, value=b"drip"))
                now = time.monotonic()
                gaps.append(now - last)
                last = now
                await asyncio.sleep(0.2)
            if max(gaps) < 0.8:
                break
            await producer.flush()  # a stalled round: start again
        else:
            pytest.fail(f"the event loop stalled in every round: gaps {gaps}")
        assert len(futs) >= 5
        assert producer._batch_processor.get_buffer_size() == len(futs)
        assert len(producer._producer) == 0
        assert not any(f.done() for f in futs)
        await producer.flush()
        assert all(f.done() and f.exception() is None for f in futs)
    finally:
        await producer.close()


async def test_an_aio_produce_with_a_timestamp_poisons_every_later_flush_until_purge(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    from confluent_kafka.aio import AIOProducer

    topic = f"{topic_prefix}.aio"
    create_topics(kafka_bootstrap, [topic])
    producer = AIOProducer({"bootstrap.servers": kafka_bootstrap, "log_level": 3})
    try:
        with pytest.raises(NotImplementedError, match="Headers"):
            await producer.produce(topic, value=b"h", headers=[("k", b"v")])
        stamped = await producer.produce(topic, value=b"t", timestamp=1_700_000_000_000)
        with pytest.raises(NotImplementedError, match="timestamps"):
            await producer.flush()
        assert isinstance(stamped.exception(), NotImplementedError)
        # the failed batch went back into the buffer: every later flush fails again
        assert producer._batch_processor.get_buffer_size() == 1
        plain = await producer.produce(topic, value=b"plain")
        with pytest.raises(NotImplementedError):
            await producer.flush()
        assert isinstance(plain.exception(), NotImplementedError)  # an innocent record too
        await producer.purge()
        assert producer._batch_processor.get_buffer_size() == 0
        # the purge of librdkafka's own queue runs on the producer's executor too: a record
        # handed over right after it may still be purged (CI saw _PURGE_QUEUE once); then
        # the next one is not
        for _ in range(3):
            again = await producer.produce(topic, value=b"after purge")
            await producer.flush()
            try:
                written = await again
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._PURGE_QUEUE:
                    raise
                continue
            break
        else:
            pytest.fail("every record after the purge was purged too")
        assert written.offset() == 0  # nothing of the poisoned batch was written
    finally:
        await producer.close()


# ------------------------------------------------------------------ 2. partitioner

PARTITIONS = 6
KEYS = [f"chat-{i}".encode() for i in range(60)]


def landed(bootstrap: str, group: str, topic: str) -> dict[bytes, int]:
    out: dict[bytes, int] = {}
    for m in read_all(bootstrap, group, topic, PARTITIONS):
        key, p = m.key(), m.partition()
        assert isinstance(key, bytes) and p is not None
        out[key] = p
    return out


def test_the_default_partitioner_differs_from_java_and_murmur2_random_matches(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Java's producer puts a keyed record at ``toPositive(murmur2(key)) % n``
    (``tests/murmur2.py``, checked against Kafka's own vectors)."""
    t_default, t_murmur = (f"{topic_prefix}.{n}" for n in ("default", "murmur"))
    create_topics(kafka_bootstrap, [t_default, t_murmur], PARTITIONS)
    produce(kafka_bootstrap, t_default, [(None, k, b"v") for k in KEYS])
    produce(
        kafka_bootstrap,
        t_murmur,
        [(None, k, b"v") for k in KEYS],
        conf={"partitioner": "murmur2_random"},
    )
    group = f"{topic_prefix}-read"
    by_default = landed(kafka_bootstrap, group, t_default)
    by_murmur = landed(kafka_bootstrap, group, t_murmur)
    by_java = {k: java_partition(k, PARTITIONS) for k in KEYS}
    assert set(by_default) == set(by_murmur) == set(KEYS)
    assert by_murmur == by_java
    assert by_default == {k: zlib.crc32(k) % PARTITIONS for k in KEYS}  # consistent_random
    moved = [k for k in KEYS if by_default[k] != by_java[k]]
    assert len(moved) > len(KEYS) // 2  # most keys land elsewhere under the default


# ------------------------------------------------------------------ 3. cooperative-sticky


def test_cooperative_sticky_moves_only_some_partitions_with_incremental_callbacks(
    kafka_bootstrap: str, topic_prefix: str, members: list[Member], admin: AdminClient
) -> None:
    topic, group = f"{topic_prefix}.in", f"{topic_prefix}-g"
    create_topics(kafka_bootstrap, [topic], 4)
    every = {(topic, p) for p in range(4)}
    a = join(members, kafka_bootstrap, group, [topic])
    pump([a], lambda: a.assigned() == every, "the first member owns every partition")
    produce(kafka_bootstrap, topic, [(p, None, b"round 1") for p in range(4)])
    pump([a], lambda: len(a.records) == 4, "the first member reads round 1")

    b = join(members, kafka_bootstrap, group, [topic])
    pump(
        [a, b],
        lambda: (
            len(b.assigned()) == 2
            and len(a.assigned()) == 2
            and a.events[-1].kind == "assign"
            and len(a.events) >= 4
        ),
        "two partitions each, every rebalance's callbacks served",
    )
    moved = b.assigned()
    kept = a.assigned()
    assert moved | kept == every and not moved & kept
    # the owner: all four at first, then a revoke of only the moved ones, then an empty
    # assign in each of the two rebalances (cooperative: revoke first, reassign next)
    assert a.kinds() == [
        ("assign", sorted(every)),
        ("revoke", sorted(moved)),
        ("assign", []),
        ("assign", []),
    ]
    # the joiner: an empty assign in the first rebalance, the moved ones in the second
    assert b.kinds() == [("assign", []), ("assign", sorted(moved))]
    assert admin.describe_consumer_groups([group])[group].result(DEADLINE_S).partition_assignor == (
        "cooperative-sticky"
    )
    assert not hasattr(Consumer, "rebalance_protocol")  # not in the Python binding

    produce(kafka_bootstrap, topic, [(p, None, b"round 2") for p in range(4)])
    pump(
        [a, b],
        lambda: (
            len([r for r in a.records if r[2] == b"round 2"]) == 2
            and len([r for r in b.records if r[2] == b"round 2"]) == 2
        ),
        "both read round 2",
    )
    kept_parts = {p for _, p in kept}
    # the kept partitions were read on from where they were: offset 0 once, then 1
    assert sorted((p, o) for p, o, _ in a.records if p in kept_parts) == sorted(
        [(p, 0) for p in kept_parts] + [(p, 1) for p in kept_parts]
    )
    assert {p for p, _, v in a.records if v == b"round 2"} == kept_parts
    # nothing committed: the joiner starts the moved ones from the beginning
    assert sorted((p, o) for p, o, _ in b.records) == sorted(
        [(p, 0) for _, p in moved] + [(p, 1) for _, p in moved]
    )


def test_a_partition_of_another_topic_goes_and_comes_with_the_subscribed_one(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """The worker's co-partitioning: each member subscribes to ``in`` alone and, in its
    callbacks, assigns and unassigns partition ``p`` of ``rq`` with partition ``p`` of
    ``in``. Its records are read, its offsets committed, and when a second member joins
    the moved partitions of both topics move together."""
    src, side, group = f"{topic_prefix}.in", f"{topic_prefix}.rq", f"{topic_prefix}-g"
    create_topics(kafka_bootstrap, [src, side], 4)
    produce(kafka_bootstrap, side, [(p, None, b"request") for p in range(4)])
    owned: dict[str, set[TP]] = {}

    def member(name: str) -> Consumer:
        c = Consumer(
            {
                "bootstrap.servers": kafka_bootstrap,
                "group.id": group,
                "group.instance.id": name,
                "partition.assignment.strategy": "cooperative-sticky",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "log_level": 3,
            }
        )
        owned[name] = set()

        def with_side(parts: list[TopicPartition]) -> list[TopicPartition]:
            return parts + [TopicPartition(side, tp.partition) for tp in parts]

        def on_assign(consumer: Consumer, parts: list[TopicPartition]) -> None:
            consumer.incremental_assign(with_side(parts))
            owned[name] |= set(tps(with_side(parts)))

        def on_revoke(consumer: Consumer, parts: list[TopicPartition]) -> None:
            consumer.incremental_unassign(with_side(parts))
            owned[name] -= set(tps(with_side(parts)))

        c.subscribe([src], on_assign=on_assign, on_revoke=on_revoke)
        return c

    a = member("a")
    read: list[TP] = []
    try:

        def reads_every_request() -> bool:
            got = [m for m in a.consume(10, 0.1) if not m.error()]
            read.extend((str(m.topic()), int(m.partition() or 0)) for m in got)
            return len(read) == 4

        wait_until(reads_every_request, "a reads the side topic's records")
        assert sorted(read) == [(side, p) for p in range(4)]
        assert (
            tps(a.assignment())
            == sorted(owned["a"])
            == sorted([(src, p) for p in range(4)] + [(side, p) for p in range(4)])
        )
        a.commit(offsets=[TopicPartition(side, 0, 1)], asynchronous=False)
        [committed] = a.committed([TopicPartition(side, 0)], timeout=DEADLINE_S)
        assert committed.offset == 1
        b = member("b")
        try:

            def shared() -> bool:
                a.consume(10, 0.05)
                b.consume(10, 0.05)
                return len(owned["a"]) == 4 and len(owned["b"]) == 4

            wait_until(shared, "two partitions of each topic each")
            for name, c in (("a", a), ("b", b)):
                mine = owned[name]
                assert tps(c.assignment()) == sorted(mine)
                assert {p for t, p in mine if t == src} == {p for t, p in mine if t == side}
        finally:
            b.close()
    finally:
        a.close()


# ------------------------------------------------------------------ 4. static membership


def two_static_members(
    bootstrap: str, prefix: str, members: list[Member], session_ms: int
) -> tuple[str, str, Member, Member]:
    topic, group = f"{prefix}.in", f"{prefix}-g"
    create_topics(bootstrap, [topic], 4)
    conf = {"session.timeout.ms": session_ms}
    a = join(members, bootstrap, group, [topic], instance_id="a", conf=conf)
    pump([a], lambda: len(a.assigned()) == 4, "a owns every partition")
    b = join(members, bootstrap, group, [topic], instance_id="b", conf=conf)
    pump(
        [a, b],
        lambda: len(a.assigned()) == 2 and len(b.assigned()) == 2 and len(a.events) >= 4,
        "two partitions each, every rebalance's callbacks served",
    )
    return topic, group, a, b


@pytest.mark.parametrize("unsubscribe", [False, True], ids=["close", "unsubscribe-then-close"])
def test_a_static_member_restarted_in_time_gets_its_partitions_back_without_a_rebalance(
    kafka_bootstrap: str,
    topic_prefix: str,
    members: list[Member],
    admin: AdminClient,
    unsubscribe: bool,
) -> None:
    """``a`` (the group's leader: it joined first) closes and comes back with the same
    ``group.instance.id`` well within its 30 s session: a LeaveGroup would have moved its
    partitions to ``b`` (a rebalance ``b`` sees); none is sent, even after
    ``unsubscribe()`` when ``close()`` follows at once."""
    topic, group, a, b = two_static_members(kafka_bootstrap, topic_prefix, members, 30000)
    had, a_id, b_id = a.assigned(), a.consumer.memberid(), b.consumer.memberid()
    b_seen = len(b.events)
    a.close(unsubscribe=unsubscribe)
    assert group_members(admin, group) == {"a": a_id, "b": b_id}  # still a member
    a2 = join(
        members,
        kafka_bootstrap,
        group,
        [topic],
        instance_id="a",
        conf={"session.timeout.ms": 30000},
    )
    pump([a2, b], lambda: a2.assigned() == had, "the restarted member gets its partitions back")
    assert a2.kinds() == [("assign", sorted(had))]
    # records on every partition: both read theirs, b polling through many heartbeats
    produce(kafka_bootstrap, topic, [(p, None, b"after") for p in range(4)])
    pump(
        [a2, b],
        lambda: (
            {v for _, _, v in a2.records} == {b"after"}
            and len([r for r in b.records if r[2] == b"after"]) == 2
        ),
        "both members read the new records",
    )
    assert b.events[b_seen:] == []  # no rebalance at b: no revoke, no (empty) assign
    now = group_members(admin, group)
    assert set(now) == {"a", "b"}
    assert now["b"] == b_id
    assert now["a"] != a_id  # the same instance under a new member id


def test_a_static_member_leaves_at_once_when_its_unsubscribe_is_polled_before_close(
    kafka_bootstrap: str, topic_prefix: str, members: list[Member], admin: AdminClient
) -> None:
    """Session 45 s, deadline 30 s: ``b`` getting ``a``'s partitions in time can only
    come from ``a``'s LeaveGroup."""
    _topic, group, a, b = two_static_members(kafka_bootstrap, topic_prefix, members, 45000)
    had = a.assigned()
    a_seen, b_seen = len(a.events), len(b.events)
    a.consumer.unsubscribe()
    pump([a], lambda: len(a.events) > a_seen, "a's revoke is served")
    assert a.kinds()[a_seen:] == [("revoke", sorted(had))]
    wait_until(lambda: set(group_members(admin, group)) == {"b"}, "a gone from the group", 30)
    a.close()
    pump([b], lambda: len(b.assigned()) == 4, "b gets a's partitions", 30)
    assert b.kinds()[b_seen:] == [("assign", sorted(had))]


@pytest.mark.slow
def test_a_closed_static_members_partitions_move_after_the_session_timeout(
    kafka_bootstrap: str,
    topic_prefix: str,
    members: list[Member],
    admin: AdminClient,
    record_property: Any,
) -> None:
    _topic, group, a, b = two_static_members(kafka_bootstrap, topic_prefix, members, 6000)
    had, b_seen = a.assigned(), len(b.events)
    t0 = time.monotonic()
    a.close()
    assert set(group_members(admin, group)) == {"a", "b"}
    pump([b], lambda: len(b.assigned()) == 4, "b gets a's partitions once a's session expired")
    moved_after = time.monotonic() - t0
    assert b.kinds()[b_seen:] == [("assign", sorted(had))]
    assert set(group_members(admin, group)) == {"b"}
    record_property("static_close_to_reassign_s", round(moved_after, 2))
    print(f"a closed static member's partitions moved after {moved_after:.1f} s (session 6 s)")


# ------------------------------------------------------------------ 5. EOS v2 (KIP-447)


def test_offsets_sent_to_a_transaction_commit_and_abort_with_its_records(
    kafka_bootstrap: str, topic_prefix: str, members: list[Member]
) -> None:
    src, out, group = f"{topic_prefix}.in", f"{topic_prefix}.out", f"{topic_prefix}-g"
    create_topics(kafka_bootstrap, [src, out])
    produce(kafka_bootstrap, src, [(0, None, b"in-%d" % i) for i in range(10)])
    c = join(members, kafka_bootstrap, group, [src])
    pump([c], lambda: len(c.records) == 10, "the consumer reads the input")
    tp = TopicPartition(src, 0)
    p = txn_producer(kafka_bootstrap, f"{topic_prefix}-tx")
    p.init_transactions(DEADLINE_S)

    p.begin_transaction()
    for i in range(5):
        p.produce(out, b"aborted-%d" % i, partition=0)
    p.send_offsets_to_transaction([TopicPartition(src, 0, 5)], c.consumer.consumer_group_metadata())
    p.abort_transaction(DEADLINE_S)
    settle(kafka_bootstrap, f"{group}-r", out, 1)
    assert c.consumer.committed([tp], DEADLINE_S)[0].offset < 0  # no offset committed
    assert read_all(kafka_bootstrap, f"{group}-r", out, 1) == []

    p.begin_transaction()
    for i in range(10):
        p.produce(out, b"out-%d" % i, partition=0)
    p.send_offsets_to_transaction(
        [TopicPartition(src, 0, 10)], c.consumer.consumer_group_metadata()
    )
    p.commit_transaction(DEADLINE_S)
    settle(kafka_bootstrap, f"{group}-r", out, 1)
    assert c.consumer.committed([tp], DEADLINE_S)[0].offset == 10
    assert [m.value() for m in read_all(kafka_bootstrap, f"{group}-r", out, 1)] == [
        b"out-%d" % i for i in range(10)
    ]


def test_stale_group_metadata_is_an_abortable_error(
    kafka_bootstrap: str, topic_prefix: str, members: list[Member]
) -> None:
    src, out, group = f"{topic_prefix}.in", f"{topic_prefix}.out", f"{topic_prefix}-g"
    create_topics(kafka_bootstrap, [src, out], 2)
    a = join(members, kafka_bootstrap, group, [src])
    pump([a], lambda: len(a.assigned()) == 2, "a owns both partitions")
    old_generation = a.consumer.consumer_group_metadata()
    b = join(members, kafka_bootstrap, group, [src])
    pump(
        [a, b],
        lambda: len(a.assigned()) == 1 and len(b.assigned()) == 1 and len(a.events) >= 4,
        "one partition each (two rebalances: two new generations)",
    )
    ((_, mine),) = a.assigned()
    p = txn_producer(kafka_bootstrap, f"{topic_prefix}-tx")
    p.init_transactions(DEADLINE_S)

    def offsets_refused(metadata: Any, offset: int) -> KafkaError:
        p.begin_transaction()
        p.produce(out, b"zombie", partition=0)
        err = raised(p.send_offsets_to_transaction, [TopicPartition(src, mine, offset)], metadata)
        assert err.txn_requires_abort() and not err.fatal() and not err.retriable()
        p.abort_transaction(DEADLINE_S)
        return err

    assert offsets_refused(old_generation, 1).code() == KafkaError.ILLEGAL_GENERATION
    # the same producer goes on: a transaction with the current metadata commits
    p.begin_transaction()
    p.produce(out, b"current", partition=0)
    p.send_offsets_to_transaction(
        [TopicPartition(src, mine, 1)], a.consumer.consumer_group_metadata()
    )
    p.commit_transaction(DEADLINE_S)
    # a member that left the group (its last metadata, current until it closed)
    last = a.consumer.consumer_group_metadata()
    a.close()
    pump([b], lambda: len(b.assigned()) == 2, "b gets a's partition")
    assert offsets_refused(last, 2).code() == KafkaError.UNKNOWN_MEMBER_ID
    settle(kafka_bootstrap, f"{group}-r", out, 2)
    assert b.consumer.committed([TopicPartition(src, mine)], DEADLINE_S)[0].offset == 1
    assert [m.value() for m in read_all(kafka_bootstrap, f"{group}-r", out, 2)] == [b"current"]


def test_a_second_producer_with_the_same_transactional_id_fences_the_first(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    topic, txn_id = f"{topic_prefix}.out", f"{topic_prefix}-tx"
    create_topics(kafka_bootstrap, [topic])
    tp = TopicPartition(topic, 0)
    first = txn_producer(kafka_bootstrap, txn_id)
    first.init_transactions(DEADLINE_S)
    first.begin_transaction()
    for i in range(3):
        first.produce(topic, b"first-%d" % i, partition=0)
    assert first.flush(DEADLINE_S) == 0  # on the broker, in the open transaction
    reader = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": f"{topic_prefix}-w", "log_level": 3}
    )
    try:
        assert reader.get_watermark_offsets(tp, DEADLINE_S) == (0, 0)  # LSO held at 0
        second = txn_producer(kafka_bootstrap, txn_id)
        second.init_transactions(DEADLINE_S)
        # the open transaction is aborted: records 0-2 and the abort marker; LSO = end
        assert reader.get_watermark_offsets(tp, DEADLINE_S) == (0, 4)
    finally:
        reader.close()
    first.produce(topic, b"first-late", partition=0)  # queued locally: no error yet
    err = raised(first.flush, DEADLINE_S)
    assert err.code() == KafkaError._FENCED and err.fatal() and not err.txn_requires_abort()
    err = raised(first.commit_transaction, DEADLINE_S)
    assert err.code() == KafkaError._FENCED and err.fatal()
    second.begin_transaction()
    second.produce(topic, b"second", partition=0)
    second.commit_transaction(DEADLINE_S)
    group = f"{topic_prefix}-r"
    settle(kafka_bootstrap, group, topic, 1)
    assert [m.value() for m in read_all(kafka_bootstrap, group, topic, 1)] == [b"second"]
    assert [
        m.value() for m in read_all(kafka_bootstrap, group, topic, 1, read_committed=False)
    ] == [
        b"first-0",
        b"first-1",
        b"first-2",
        b"second",
    ]


# ------------------------------------------------------------------ 6. watermarks


def test_a_read_committed_watermark_is_the_last_stable_offset(
    kafka_bootstrap: str, topic_prefix: str, admin: AdminClient
) -> None:
    topic = f"{topic_prefix}.log"
    create_topics(kafka_bootstrap, [topic])
    tp = TopicPartition(topic, 0)
    open_txn = txn_producer(kafka_bootstrap, f"{topic_prefix}-tx")
    open_txn.init_transactions(DEADLINE_S)
    open_txn.begin_transaction()
    open_txn.produce(topic, b"open", partition=0)  # offset 0, its transaction left open
    assert open_txn.flush(DEADLINE_S) == 0
    produce(kafka_bootstrap, topic, [(0, None, b"plain-%d" % i) for i in range(3)])  # 1..3

    def watermarks(isolation: str) -> tuple[int, int]:
        c = Consumer(
            {
                "bootstrap.servers": kafka_bootstrap,
                "group.id": f"{topic_prefix}-w",
                "log_level": 3,
                **({"isolation.level": isolation} if isolation else {}),
            }
        )
        try:
            return c.get_watermark_offsets(tp, DEADLINE_S)
        finally:
            c.close()

    def listed(level: IsolationLevel) -> int:
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        futs = admin.list_offsets({tp: latest}, isolation_level=level)
        return int(futs[tp].result(DEADLINE_S).offset)

    assert watermarks("") == (0, 0)  # librdkafka's default: read_committed
    assert watermarks("read_committed") == (0, 0)  # the LSO: below the committed 1..3
    assert watermarks("read_uncommitted") == (0, 4)  # the high watermark
    assert listed(IsolationLevel.READ_COMMITTED) == 0
    assert listed(IsolationLevel.READ_UNCOMMITTED) == 4
    open_txn.commit_transaction(DEADLINE_S)
    # the commit marker follows the coordinator's decision: wait for the LSO to move
    wait_until(lambda: watermarks("read_committed") == (0, 5), "LSO past the commit marker")
    assert listed(IsolationLevel.READ_COMMITTED) == 5
    assert [m.value() for m in read_all(kafka_bootstrap, f"{topic_prefix}-r", topic, 1)] == [
        b"open",
        b"plain-0",
        b"plain-1",
        b"plain-2",
    ]


# ------------------------------------------------------------------ 7. callbacks' thread


def test_rebalance_callbacks_run_inside_poll_or_consume_on_the_calling_thread(
    kafka_bootstrap: str, topic_prefix: str, members: list[Member]
) -> None:
    """``a`` is driven by ``consume()`` on a thread of its own, ``b`` by ``poll()`` on the
    test's thread; every callback of each ran on its driver's thread, inside that call."""
    topic, group = f"{topic_prefix}.in", f"{topic_prefix}-g"
    create_topics(kafka_bootstrap, [topic], 2)
    a = join(members, kafka_bootstrap, group, [topic])
    stop = threading.Event()
    failure: list[BaseException] = []

    def drive_a() -> None:
        try:
            while not stop.is_set():
                a.consume(0.05)
        except BaseException as exc:  # reported by the test
            failure.append(exc)

    driver = threading.Thread(target=drive_a, name="drive-a")
    driver.start()
    try:
        wait_until(lambda: len(a.events) >= 1 or bool(failure), "a's first assign")
        b = join(members, kafka_bootstrap, group, [topic])
        pump(
            [b],
            lambda: (len(b.assigned()) == 1 and len(a.events) >= 4) or bool(failure),
            "one each",
        )
    finally:
        stop.set()
        driver.join(DEADLINE_S)
    assert not failure, failure
    assert driver.ident is not None and driver.ident != threading.get_ident()
    assert [(e.thread, e.inside) for e in a.events] == [(driver.ident, "consume")] * len(a.events)
    me = threading.get_ident()
    assert [(e.thread, e.inside) for e in b.events] == [(me, "poll")] * len(b.events)
    assert {e.kind for e in a.events} == {"assign", "revoke"}


# ------------------------------------------------------------------ 8. one consumer, two callers


def test_a_call_from_another_thread_waits_for_a_running_consume(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """The 2.16 gate (CKP #2322) on the sync ``Consumer``: a call from a second thread
    waits until the first thread's running ``consume()`` returns."""
    topic = f"{topic_prefix}.in"
    create_topics(kafka_bootstrap, [topic])
    sync = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": f"{topic_prefix}-g", "log_level": 3}
    )
    try:
        sync.subscribe([topic])
        wait_until(lambda: not sync.consume(10, 0.1) and bool(sync.assignment()), "assigned")
        # a round proves nothing when the call got in before the runner entered consume()
        # (0.2 s head start, the runner's consume() runs 3 s): at most 3 rounds
        for _round in range(3):
            runner = threading.Thread(target=sync.consume, args=(10, 3.0))
            runner.start()
            time.sleep(0.2)
            assert sync.assignment() == [TopicPartition(topic, 0)]
            waited = not runner.is_alive()  # assignment() returned after consume() did
            runner.join(DEADLINE_S)
            if waited:
                break
        else:
            pytest.fail("assignment() returned during a running consume() in every round")
    finally:
        sync.close()


async def test_an_aio_consumer_serializes_its_calls_but_admits_its_callbacks_calls(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """The same gate on the AIOConsumer: a second task's call waits for a running
    ``consume()``, while an ``async def`` rebalance callback's own call goes through."""
    from confluent_kafka.aio import AIOConsumer

    topic = f"{topic_prefix}.in"
    create_topics(kafka_bootstrap, [topic])
    seen: list[list[TopicPartition]] = []

    async def on_assign(consumer: Any, partitions: list[TopicPartition]) -> None:
        seen.append(await consumer.assignment())  # re-entrant: admitted at once

    aio = AIOConsumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": f"{topic_prefix}-g", "log_level": 3}
    )
    try:
        await aio.subscribe([topic], on_assign=on_assign)
        deadline = time.monotonic() + DEADLINE_S
        while not seen:
            assert time.monotonic() < deadline, "no on_assign"
            await aio.consume(10, 0.1)
        assert seen == [[]]  # inside on_assign, before the binding's assign
        assert await aio.assignment() == [TopicPartition(topic, 0)]
        for _round in range(3):
            running = asyncio.create_task(aio.consume(10, 3.0))
            await asyncio.sleep(0.2)
            await aio.assignment()
            waited = running.done()  # the second call waited for the running consume()
            await running
            if waited:
                break
        else:
            pytest.fail("the AIOConsumer ran two calls side by side in every round")
    finally:
        await aio.close()


# ------------------------------------------------------------------ the register


@dataclass(frozen=True)
class Fact:
    """One librdkafka fact the runtime relies on: what the notes claimed, whether the
    broker bore it out (``verified``) or not (``corrected``), and the test showing it."""

    name: str
    notes: str
    verdict: str
    test: str


_HERE = "tests/kafka/test_librdkafka_facts.py::"

#: Every fact, one test a row (the module docstring's table says what was seen).
REGISTER: tuple[Fact, ...] = (
    Fact(
        "aio module of 2.16",
        "AIOConsumer: 2 workers, get_event_loop()",
        "corrected",
        _HERE + "test_the_aio_module_of_2_16",
    ),
    Fact(
        "AIO produce is buffered until flush",
        "flush / 1000 / 1 s idle",
        "verified",
        _HERE + "test_a_lone_aio_produce_stays_in_the_python_buffer_until_flush",
    ),
    Fact(
        "a lone AIO produce's delivery without flush",
        "1 s",
        "corrected (2-2.5 s)",
        _HERE + "test_without_flush_a_lone_aio_produce_is_delivered_by_the_buffer_timer",
    ),
    Fact(
        "a trickle stays buffered",
        "can stay buffered",
        "verified",
        _HERE + "test_a_steady_trickle_of_aio_produces_never_leaves_the_buffer",
    ),
    Fact(
        "AIO timestamp/headers",
        "timestamp fails its batch",
        "corrected (poisons the buffer)",
        _HERE + "test_an_aio_produce_with_a_timestamp_poisons_every_later_flush_until_purge",
    ),
    Fact(
        "partitioner",
        "consistent_random differs, murmur2_random matches",
        "verified",
        _HERE + "test_the_default_partitioner_differs_from_java_and_murmur2_random_matches",
    ),
    Fact(
        "cooperative-sticky callbacks",
        "incremental; rebalance_protocol()",
        "corrected (no rebalance_protocol() in Python)",
        _HERE + "test_cooperative_sticky_moves_only_some_partitions_with_incremental_callbacks",
    ),
    Fact(
        "static restart without rebalance",
        "old assignment back, no rebalance",
        "verified",
        _HERE + "test_a_static_member_restarted_in_time_gets_its_partitions_back_without_a_"
        "rebalance",
    ),
    Fact(
        "static unsubscribe sends LeaveGroup",
        "unsubscribe() sends one",
        "corrected (only when the revoke is polled before close())",
        _HERE + "test_a_static_member_leaves_at_once_when_its_unsubscribe_is_polled_before_close",
    ),
    Fact(
        "closed static member's partitions move",
        "after session.timeout.ms",
        "verified",
        _HERE + "test_a_closed_static_members_partitions_move_after_the_session_timeout",
    ),
    Fact(
        "EOS v2 offsets with records",
        "commit together",
        "verified",
        _HERE + "test_offsets_sent_to_a_transaction_commit_and_abort_with_its_records",
    ),
    Fact(
        "zombie group metadata",
        "abortable",
        "verified",
        _HERE + "test_stale_group_metadata_is_an_abortable_error",
    ),
    Fact(
        "same transactional.id",
        "fatal _FENCED; init aborts the open txn",
        "verified",
        _HERE + "test_a_second_producer_with_the_same_transactional_id_fences_the_first",
    ),
    Fact(
        "watermarks under an open txn",
        "read_committed: LSO",
        "verified",
        _HERE + "test_a_read_committed_watermark_is_the_last_stable_offset",
    ),
    Fact(
        "sync Consumer, two threads",
        "(CKP #2322 pending after 2.15)",
        "corrected (a second thread's call waits for a running consume())",
        _HERE + "test_a_call_from_another_thread_waits_for_a_running_consume",
    ),
    Fact(
        "AIOConsumer, two tasks",
        "re-entrant calls need a free worker, may deadlock",
        "corrected (serialized; a callback's call admitted)",
        _HERE + "test_an_aio_consumer_serializes_its_calls_but_admits_its_callbacks_calls",
    ),
    Fact(
        "co-partitioning beside cooperative-sticky",
        "(not covered)",
        "verified (new: a side topic's partitions assigned in the callbacks)",
        _HERE + "test_a_partition_of_another_topic_goes_and_comes_with_the_subscribed_one",
    ),
    Fact(
        "callbacks' thread",
        "inside poll()/consume()",
        "verified",
        _HERE + "test_rebalance_callbacks_run_inside_poll_or_consume_on_the_calling_thread",
    ),
)


def test_every_fact_has_a_test_of_its_own_and_every_test_a_row() -> None:
    names = [f.test.removeprefix(_HERE) for f in REGISTER]
    assert len(set(names)) == len(names)
    module = globals()
    assert all(callable(module.get(n)) for n in names), [n for n in names if n not in module]
    tests = {n for n in module if n.startswith("test_")} - {
        "test_every_fact_has_a_test_of_its_own_and_every_test_a_row"
    }
    assert tests == set(names)
    assert {f.verdict.split()[0] for f in REGISTER} <= {"verified", "corrected"}
    assert all(f.test.startswith(_HERE) for f in REGISTER)
