"""The broker probe: what botmesh needs from Kafka, through aiokafka, against the session broker.

Consumer-group commits, transactions (commit and abort), ``send_offsets_to_transaction`` and a
``read_committed`` consumer. A Kafka release that breaks one of them with aiokafka fails here
(deploy/kafka/README.md lists the releases tried).
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from tests.kafka.broker import committed_offsets, create_topics, end_offsets, kafka_tool

pytestmark = pytest.mark.kafka


async def _drain(consumer: AIOKafkaConsumer, want: int, limit_s: float = 30) -> list[bytes]:
    """Values until ``want`` records arrived (or ``limit_s`` passed: then what arrived)."""
    got: list[bytes] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while len(got) < want and loop.time() < deadline:
        batches = await consumer.getmany(timeout_ms=500)
        for records in batches.values():
            got.extend(r.value for r in records if r.value is not None)
    return got


async def _settle(consumer: AIOKafkaConsumer, rounds: int = 3) -> list[bytes]:
    """Whatever else arrives in a few more polls (to see records that must not be there)."""
    extra: list[bytes] = []
    for _ in range(rounds):
        batches = await consumer.getmany(timeout_ms=300)
        for records in batches.values():
            extra.extend(r.value for r in records if r.value is not None)
    return extra


def _consumer(bootstrap: str, *topics: str, **kw: object) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **kw,
    )


async def test_consumer_group_commit_and_resume(kafka_bootstrap: str, topic_prefix: str) -> None:
    topic, group = f"{topic_prefix}.in", f"{topic_prefix}.g"
    create_topics(kafka_bootstrap, [topic], partitions=2)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(10):
            await producer.send_and_wait(topic, f"v{i}".encode(), key=f"k{i % 4}".encode())
    finally:
        await producer.stop()

    first = _consumer(kafka_bootstrap, topic, group_id=group)
    await first.start()
    try:
        got = await _drain(first, 10)
        assert sorted(got) == sorted(f"v{i}".encode() for i in range(10))
        await first.commit()
    finally:
        await first.stop()

    assert committed_offsets(kafka_bootstrap, group) == {
        (topic, p): high for p, high in end_offsets(kafka_bootstrap, topic).items()
    }

    # a new member of the group resumes after the commit: nothing old is redelivered
    second = _consumer(kafka_bootstrap, topic, group_id=group)
    await second.start()
    try:
        assert await _settle(second) == []
        for p in (0, 1):
            assert await second.committed(TopicPartition(topic, p)) is not None
    finally:
        await second.stop()


async def test_transactions_commit_abort_read_committed(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    topic = f"{topic_prefix}.tx"
    create_topics(kafka_bootstrap, [topic], partitions=1)
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, transactional_id=f"{topic_prefix}.txid"
    )
    await producer.start()
    try:
        await producer.begin_transaction()
        for v in (b"c1", b"c2"):
            await producer.send(topic, v)
        await producer.commit_transaction()

        await producer.begin_transaction()
        for v in (b"a1", b"a2"):
            await producer.send_and_wait(topic, v)
        await producer.abort_transaction()

        async with producer.transaction():
            await producer.send(topic, b"c3")
    finally:
        await producer.stop()

    committed = _consumer(kafka_bootstrap, topic, isolation_level="read_committed")
    await committed.start()
    try:
        got = await _drain(committed, 3)
        got += await _settle(committed)
        assert got == [b"c1", b"c2", b"c3"]
    finally:
        await committed.stop()

    uncommitted = _consumer(kafka_bootstrap, topic, isolation_level="read_uncommitted")
    await uncommitted.start()
    try:
        got = await _drain(uncommitted, 5)
        assert got == [b"c1", b"c2", b"a1", b"a2", b"c3"]
    finally:
        await uncommitted.stop()


async def test_send_offsets_to_transaction(kafka_bootstrap: str, topic_prefix: str) -> None:
    """Consume → produce → commit the input offsets in the same transaction (and abort one)."""
    src, dst, group = f"{topic_prefix}.src", f"{topic_prefix}.dst", f"{topic_prefix}.g"
    create_topics(kafka_bootstrap, [src, dst], partitions=1)
    plain = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await plain.start()
    try:
        for i in range(4):
            await plain.send_and_wait(src, f"m{i}".encode())
    finally:
        await plain.stop()

    tp = TopicPartition(src, 0)
    consumer = _consumer(kafka_bootstrap, src, group_id=group, isolation_level="read_committed")
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, transactional_id=f"{topic_prefix}.ctp"
    )
    await consumer.start()
    await producer.start()
    try:
        batch = await _drain(consumer, 4)
        assert batch == [b"m0", b"m1", b"m2", b"m3"]

        # first two: committed together with their input offsets
        async with producer.transaction():
            for v in batch[:2]:
                await producer.send(dst, v.upper())
            await producer.send_offsets_to_transaction({tp: OffsetAndMetadata(2, "")}, group)

        # last two: aborted, so neither the outputs nor the offset commit take effect
        await producer.begin_transaction()
        for v in batch[2:]:
            await producer.send(dst, v.upper())
        await producer.send_offsets_to_transaction({tp: OffsetAndMetadata(4, "")}, group)
        await producer.abort_transaction()
    finally:
        await producer.stop()
        await consumer.stop()

    assert committed_offsets(kafka_bootstrap, group) == {(src, 0): 2}
    out = _consumer(kafka_bootstrap, dst, isolation_level="read_committed")
    await out.start()
    try:
        got = await _drain(out, 2)
        got += await _settle(out)
        assert got == [b"M0", b"M1"]
    finally:
        await out.stop()

    # the group resumes at the committed offset: the aborted input is processed again
    again = _consumer(kafka_bootstrap, src, group_id=group, isolation_level="read_committed")
    await again.start()
    try:
        assert await _drain(again, 2) == [b"m2", b"m3"]
    finally:
        await again.stop()


async def test_cli_tools_reset_group_offsets(kafka_bootstrap: str, topic_prefix: str) -> None:
    """``kafka.sh tool consumer-groups --reset-offsets`` and ``get-offsets`` work on this broker."""
    topic, group = f"{topic_prefix}.cli", f"{topic_prefix}.g"
    create_topics(kafka_bootstrap, [topic], partitions=1)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for i in range(3):
            await producer.send_and_wait(topic, f"r{i}".encode())
    finally:
        await producer.stop()
    consumer = _consumer(kafka_bootstrap, topic, group_id=group)
    await consumer.start()
    try:
        assert len(await _drain(consumer, 3)) == 3
        await consumer.commit()
    finally:
        await consumer.stop()
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
