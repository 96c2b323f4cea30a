"""The broker probe: what botmesh needs from Kafka, through confluent-kafka (librdkafka), against
the session broker.

The idempotent producer (acks=all), consumer-group commits, transactions (commit and abort),
``send_offsets_to_transaction`` and a ``read_committed`` consumer. A Kafka release that breaks one
of them with librdkafka fails here (deploy/kafka/README.md lists the releases tried).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from botmesh.streams.connection import confluent_options, producer_options
from tests.kafka.broker import committed_offsets, create_topics, end_offsets, kafka_tool

pytestmark = pytest.mark.kafka

#: How long a client call or a wait below may take before the test fails (a hang guard).
LIMIT_S = 30.0


def _producer(bootstrap: str, transactional_id: str | None = None) -> Producer:
    """librdkafka's producer as botmesh sets it up: acks=all, idempotent, murmur2; with
    ``transactional_id`` a transactional one (its transactions initialised)."""
    conf = {**producer_options(bootstrap), "log_level": 3}
    if transactional_id is None:
        return Producer(conf)
    producer = Producer({**conf, "transactional.id": transactional_id})
    producer.init_transactions(LIMIT_S)
    return producer


def _send(producer: Producer, topic: str, records: Iterable[tuple[bytes | None, bytes]]) -> None:
    """Produce ``(key, value)`` records and wait until the broker acked each of them (the
    test fails naming a record it refused, or when one is still unacked after ``LIMIT_S``)."""
    failed: list[str] = []
    acked: list[int | None] = []

    def report(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            failed.append(f"{msg.value()!r}: {err}")
        else:
            acked.append(msg.offset())

    sent = 0
    for key, value in records:
        producer.produce(topic, value, key, on_delivery=report)
        sent += 1
    assert producer.flush(LIMIT_S) == 0, f"records not acked after {LIMIT_S} s"
    assert failed == [], failed
    assert len(acked) == sent


def _consumer(
    bootstrap: str, group: str, *topics: str, isolation: str = "read_uncommitted"
) -> Consumer:
    """A member of ``group`` subscribed to ``topics`` (from the earliest offset, nothing
    committed but what the test commits)."""
    consumer = Consumer(
        {
            **confluent_options(bootstrap),
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "log_level": 3,
        }
    )
    consumer.subscribe(list(topics))
    return consumer


def _reader(bootstrap: str, topic: str, *, isolation: str = "read_uncommitted") -> Consumer:
    """A consumer of every partition of ``topic`` from its beginning, in no group (it assigns
    the partitions itself and commits nothing)."""
    consumer = Consumer(
        {
            **confluent_options(bootstrap),
            "group.id": f"{topic}.reader",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "log_level": 3,
        }
    )
    partitions = consumer.list_topics(topic, timeout=LIMIT_S).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(partitions)])
    return consumer


def _values(messages: list[Message]) -> list[bytes]:
    """The values of the records among ``messages`` (the test fails on a consumer error)."""
    out = []
    for m in messages:
        err = m.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF or err.retriable():
                continue
            raise KafkaException(err)
        value = m.value()
        if value is not None:
            out.append(value)
    return out


def _drain(consumer: Consumer, want: int, limit_s: float = LIMIT_S) -> list[bytes]:
    """Values until ``want`` records arrived (or ``limit_s`` passed: then what arrived)."""
    got: list[bytes] = []
    deadline = time.monotonic() + limit_s
    while len(got) < want and time.monotonic() < deadline:
        got.extend(_values(consumer.consume(100, 0.5)))
    return got


def _settle(consumer: Consumer, rounds: int = 3) -> list[bytes]:
    """Whatever else arrives in a few more polls (to see records that must not be there)."""
    extra: list[bytes] = []
    for _ in range(rounds):
        extra.extend(_values(consumer.consume(100, 0.3)))
    return extra


def _assigned(consumer: Consumer, partitions: int) -> list[bytes]:
    """Poll until the group gave ``consumer`` ``partitions`` partitions; what arrived meanwhile."""
    got: list[bytes] = []
    deadline = time.monotonic() + LIMIT_S
    while len(consumer.assignment()) < partitions:
        assert time.monotonic() < deadline, f"not {partitions} partitions after {LIMIT_S} s"
        got.extend(_values(consumer.consume(100, 0.3)))
    return got


def test_consumer_group_commit_and_resume(kafka_bootstrap: str, topic_prefix: str) -> None:
    topic, group = f"{topic_prefix}.in", f"{topic_prefix}.g"
    create_topics(kafka_bootstrap, [topic], partitions=2)
    producer = _producer(kafka_bootstrap)
    _send(producer, topic, [(f"k{i % 4}".encode(), f"v{i}".encode()) for i in range(10)])
    ends = end_offsets(kafka_bootstrap, topic)
    assert all(ends.values()), ends  # both partitions hold records: both get a commit

    first = _consumer(kafka_bootstrap, group, topic)
    try:
        got = _drain(first, 10)
        assert sorted(got) == sorted(f"v{i}".encode() for i in range(10))
        first.commit(asynchronous=False)
    finally:
        first.close()

    assert committed_offsets(kafka_bootstrap, group) == {
        (topic, p): high for p, high in ends.items()
    }

    # a new member of the group resumes after the commit: nothing old is redelivered
    second = _consumer(kafka_bootstrap, group, topic)
    try:
        assert _assigned(second, 2) + _settle(second) == []
        tps = [TopicPartition(topic, p) for p in (0, 1)]
        committed = second.committed(tps, timeout=LIMIT_S)
        assert {tp.partition: tp.offset for tp in committed} == ends
    finally:
        second.close()


def test_transactions_commit_abort_read_committed(kafka_bootstrap: str, topic_prefix: str) -> None:
    topic = f"{topic_prefix}.tx"
    create_topics(kafka_bootstrap, [topic], partitions=1)
    producer = _producer(kafka_bootstrap, f"{topic_prefix}.txid")
    try:
        producer.begin_transaction()
        for v in (b"c1", b"c2"):
            producer.produce(topic, v)
        producer.commit_transaction(LIMIT_S)

        producer.begin_transaction()
        _send(producer, topic, [(None, b"a1"), (None, b"a2")])  # on the log, then aborted
        producer.abort_transaction(LIMIT_S)

        producer.begin_transaction()
        producer.produce(topic, b"c3")
        producer.commit_transaction(LIMIT_S)
    finally:
        producer.flush(LIMIT_S)

    committed = _reader(kafka_bootstrap, topic, isolation="read_committed")
    try:
        got = _drain(committed, 3)
        got += _settle(committed)
        assert got == [b"c1", b"c2", b"c3"]
    finally:
        committed.close()

    uncommitted = _reader(kafka_bootstrap, topic, isolation="read_uncommitted")
    try:
        got = _drain(uncommitted, 5)
        assert got == [b"c1", b"c2", b"a1", b"a2", b"c3"]
    finally:
        uncommitted.close()


def test_send_offsets_to_transaction(kafka_bootstrap: str, topic_prefix: str) -> None:
    """Consume → produce → commit the input offsets in the same transaction (and abort one)."""
    src, dst, group = f"{topic_prefix}.src", f"{topic_prefix}.dst", f"{topic_prefix}.g"
    create_topics(kafka_bootstrap, [src, dst], partitions=1)
    _send(_producer(kafka_bootstrap), src, [(None, f"m{i}".encode()) for i in range(4)])

    consumer = _consumer(kafka_bootstrap, group, src, isolation="read_committed")
    producer = _producer(kafka_bootstrap, f"{topic_prefix}.ctp")
    try:
        batch = _drain(consumer, 4)
        assert batch == [b"m0", b"m1", b"m2", b"m3"]
        member = consumer.consumer_group_metadata()

        # first two: committed together with their input offsets
        producer.begin_transaction()
        for v in batch[:2]:
            producer.produce(dst, v.upper())
        producer.send_offsets_to_transaction([TopicPartition(src, 0, 2)], member, LIMIT_S)
        producer.commit_transaction(LIMIT_S)

        # last two: aborted, so neither the outputs nor the offset commit take effect
        producer.begin_transaction()
        for v in batch[2:]:
            producer.produce(dst, v.upper())
        producer.send_offsets_to_transaction([TopicPartition(src, 0, 4)], member, LIMIT_S)
        producer.abort_transaction(LIMIT_S)
    finally:
        producer.flush(LIMIT_S)
        consumer.close()

    assert committed_offsets(kafka_bootstrap, group) == {(src, 0): 2}
    out = _reader(kafka_bootstrap, dst, isolation="read_committed")
    try:
        got = _drain(out, 2)
        got += _settle(out)
        assert got == [b"M0", b"M1"]
    finally:
        out.close()

    # the group resumes at the committed offset: the aborted input is processed again
    again = _consumer(kafka_bootstrap, group, src, isolation="read_committed")
    try:
        assert _drain(again, 2) == [b"m2", b"m3"]
    finally:
        again.close()


def test_cli_tools_reset_group_offsets(kafka_bootstrap: str, topic_prefix: str) -> None:
    """``kafka.sh tool consumer-groups --reset-offsets`` and ``get-offsets`` work on this broker."""
    topic, group = f"{topic_prefix}.cli", f"{topic_prefix}.g"
    create_topics(kafka_bootstrap, [topic], partitions=1)
    _send(_producer(kafka_bootstrap), topic, [(None, f"r{i}".encode()) for i in range(3)])
    consumer = _consumer(kafka_bootstrap, group, topic)
    try:
        assert len(_drain(consumer, 3)) == 3
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    assert committed_offsets(kafka_bootstrap, group) == {(topic, 0): 3}

    offsets = kafka_tool("get-offsets", "--bootstrap-server", kafka_bootstrap, "--topic", topic)
    assert offsets.returncode == 0, offsets.stderr
    assert offsets.stdout.split() == [f"{topic}:0:3"]

    reset = kafka_tool(
        "consumer-groups", "--bootstrap-server", kafka_bootstrap, "--group", group,
        "--topic", topic, "--reset-offsets", "--to-offset", "1", "--execute",
    )  # fmt: skip
    assert reset.returncode == 0, reset.stderr
    assert committed_offsets(kafka_bootstrap, group) == {(topic, 0): 1}
