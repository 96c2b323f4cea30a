"""``botmesh.streams.clients``: the confluent-kafka producer and readers of the gateway, the
operator's commands and the console. Settings first (no broker), then on a real broker: a
send resolves when acked, where the broker wrote it; a read to the end stops at the end
offsets taken before it, also when the last offsets are transaction markers."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Message, Producer

from botmesh.streams.clients import (
    AsyncProducer,
    Delivered,
    read_to_end,
    reader,
    watermarks,
)
from botmesh.streams.connection import (
    KafkaSettings,
    Security,
    confluent_options,
    consumer_options,
    producer_options,
)
from botmesh.streams.provision import ensure_topics
from botmesh.topics.catalog import Catalog


def test_producers_partition_as_java_and_carry_the_security(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("pw\n")
    s = KafkaSettings(
        "b1:9093",
        Security.from_env(
            {
                "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
                "KAFKA_SASL_USERNAME": "bot",
                "KAFKA_SASL_PASSWORD_FILE": str(secret),
            }
        ),
    )
    durable = producer_options(s)
    assert durable == {
        **confluent_options(s),
        "partitioner": "murmur2_random",
        "acks": "all",
        "enable.idempotence": True,
    }
    assert durable["sasl.password"] == "pw" and durable["sasl.mechanism"] == "SCRAM-SHA-256"
    assert producer_options(s, durable=False) == {
        **confluent_options(s),
        "partitioner": "murmur2_random",
    }
    reading = consumer_options(s, "g")
    assert reading["group.id"] == "g" and reading["enable.auto.commit"] is False
    assert reading["sasl.username"] == "bot"


@pytest.mark.kafka
async def test_a_send_resolves_with_where_the_broker_wrote_it(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    cat = Catalog(topic_prefix)
    ensure_topics(kafka_bootstrap, cat.specs(partitions=2))
    producer = AsyncProducer(kafka_bootstrap)
    try:
        first = await producer.send_and_wait(cat.inbound, b"a", key=b"k", partition=1)
        pending = [await producer.send(cat.inbound, b"b", key=b"k", partition=1)]
        pending.append(await producer.send(cat.inbound, b"c", headers=[("h", b"v")], partition=0))
        rest = await asyncio.gather(*pending)
    finally:
        await producer.close()
    await producer.close()  # again: nothing
    assert first == Delivered(cat.inbound, 1, 0)
    assert rest == [Delivered(cat.inbound, 1, 1), Delivered(cat.inbound, 0, 0)]
    with pytest.raises(RuntimeError, match="closed"):
        await producer.send(cat.inbound, b"late")


@pytest.mark.kafka
def test_a_read_stops_at_the_end_taken_before_it_past_transaction_markers(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    cat = Catalog(topic_prefix)
    ensure_topics(kafka_bootstrap, cat.specs(partitions=2))
    tx = Producer(
        {
            **producer_options(kafka_bootstrap),
            "transactional.id": f"{topic_prefix}-{uuid.uuid4().hex[:6]}",
        }
    )
    tx.init_transactions(30)
    tx.begin_transaction()
    for n in range(5):
        tx.produce(cat.inbound, f"v{n}".encode(), b"k", partition=0)
    tx.commit_transaction(30)  # the partition ends with a commit marker, never a record
    consumer = reader(kafka_bootstrap, f"{topic_prefix}.reader")
    tps = [(cat.inbound, 0), (cat.inbound, 1)]
    try:
        # the coordinator writes the marker after the commit returned: waited for
        deadline = time.monotonic() + 30
        while (spans := watermarks(consumer, tps))[(cat.inbound, 0)] != (0, 6):
            assert time.monotonic() < deadline, spans
        assert spans[(cat.inbound, 1)] == (0, 0)
        tx.begin_transaction()
        tx.produce(cat.inbound, b"later", b"k", partition=0)
        tx.commit_transaction(30)  # after the ends were taken: not read
        seen: list[Message] = []
        assert read_to_end(consumer, spans, seen.append) == 5
    finally:
        consumer.close()
    assert [m.value() for m in seen] == [f"v{n}".encode() for n in range(5)]
