"""confluent-kafka (librdkafka) clients for the asyncio code outside the worker: the gateway,
the operator's commands and the console.

- :class:`AsyncProducer`: librdkafka's producer with its delivery reports served by a thread
  of its own; :meth:`AsyncProducer.send` enqueues a record and returns a future that
  resolves (:class:`Delivered`) when the broker acked it, or fails with the record's error.
  Nothing is buffered in Python: librdkafka batches (``linger.ms``) and sends. Settings from
  ``connection.producer_options``: the partitioner of Java's producer
  (murmur2), and ``acks=all`` with idempotence unless ``durable=False``.
- :func:`reader`, :func:`watermarks`, :func:`read_to_end`: a consumer that assigns its
  partitions itself (no group joined, nothing committed), the offsets a partition spans,
  and a read of partitions from their start to the end offsets taken before.
- :func:`metadata`: the first contact (``connection.list_topics``): a ``ConnectionError``
  naming the brokers, or ``KafkaAuthError`` naming the setting to fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from botmesh.streams.connection import (
    Brokers,
    consumer_options,
    list_topics,
    producer_options,
)

__all__ = [
    "ONE_SHOT",
    "AsyncProducer",
    "Delivered",
    "metadata",
    "partitions_of",
    "read_to_end",
    "reader",
    "wait_topic",
    "watermarks",
]

_LOG = logging.getLogger("botmesh.streams.kafka")

#: a partition without a known leader (yet): asked again
_LEADERLESS = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._WAIT_COORD,
}

#: ``(topic, partition)``
Where = tuple[str, int]
Headers = list[tuple[str, bytes]]


#: The settings of a producer made for a few records and closed at once (a command, a
#: dead letter's redrive): acks=all without idempotence, since librdkafka's idempotent
#: producer first acquires a producer id, which took 0.5 s a producer here (its first
#: record waited for it) against 0.01 s without. A retry of such a producer could write a
#: record twice; the journal answers a second copy of an inbound or a request as a
#: duplicate.
ONE_SHOT: dict[str, Any] = {"enable.idempotence": False}


@dataclass(frozen=True, slots=True)
class Delivered:
    """Where the broker wrote an acked record."""

    topic: str
    partition: int
    offset: int


async def metadata(brokers: Brokers, within: float = 5.0) -> Any:
    """The cluster's metadata (``ClusterMetadata``), the first contact of a command:
    ``ConnectionError`` (``cannot reach Kafka at ...``) when no broker answers within
    ``within`` seconds, ``KafkaAuthError`` when the brokers refuse this client."""
    return await asyncio.to_thread(list_topics, brokers, within)


def partitions_of(cluster: Any, topic: str) -> list[int]:
    """The partitions of ``topic`` in ``cluster`` (``ClusterMetadata``); ``[]`` when the
    cluster does not have the topic."""
    t = cluster.topics.get(topic)
    if t is None or t.error is not None:
        return []
    return sorted(int(p) for p in t.partitions)


class AsyncProducer:
    """librdkafka's producer for asyncio code (see the module's docstring). Make it inside
    the running loop; ``close()`` it (flushes first)."""

    def __init__(
        self,
        brokers: Brokers,
        *,
        durable: bool = True,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        conf = {
            **producer_options(brokers, durable=durable),
            # librdkafka's errors through Python's logging (served by the poller), not stderr
            "logger": _LOG,
            "log_level": 3,
            **(settings or {}),
        }
        self._producer = Producer(conf)
        self._stopping = threading.Event()
        self._poller = threading.Thread(target=self._serve, name="botmesh-producer", daemon=True)
        self._poller.start()
        self._closed = False

    def _serve(self) -> None:
        """Serve the delivery reports (their callbacks run here) until closed."""
        while not self._stopping.is_set():
            self._producer.poll(0.1)

    def _report(self, fut: asyncio.Future[Delivered]) -> Callable[[Any, Any], None]:
        def done(err: KafkaError | None, msg: Message) -> None:
            # on librdkafka's thread: read the message here, resolve on the loop
            if err is not None:
                outcome: Delivered | BaseException = KafkaException(err)
            else:
                outcome = Delivered(
                    str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0)
                )
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                self._loop.call_soon_threadsafe(_settle, fut, outcome)

        return done

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Headers | None = None,
        partition: int = -1,
    ) -> asyncio.Future[Delivered]:
        """Enqueue one record (waiting while librdkafka's queue is full); the future
        resolves when the broker acked it. ``partition``: the key's (murmur2) unless given."""
        if self._closed:
            raise RuntimeError("the producer is closed")
        fut: asyncio.Future[Delivered] = self._loop.create_future()
        while True:
            try:
                self._producer.produce(
                    topic,
                    value,
                    key,
                    partition,
                    on_delivery=self._report(fut),
                    headers=headers,  # type: ignore[arg-type]  # (str, bytes) pairs
                )
                return fut
            except BufferError:  # the queue is full: the poller drains it
                await asyncio.sleep(0.01)

    async def send_and_wait(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Headers | None = None,
        partition: int = -1,
    ) -> Delivered:
        sent = await self.send(topic, value, key=key, headers=headers, partition=partition)
        return await sent

    async def metadata(self, within: float = 5.0) -> Any:
        """The cluster's metadata through this producer's connections (no topic created);
        ``KafkaException`` when no broker answers within ``within`` seconds."""
        return await asyncio.to_thread(self._producer.list_topics, None, within)

    async def flush(self, within: float) -> int:
        """Wait up to ``within`` seconds for every record enqueued to be acked (or failed);
        how many are left."""
        return await asyncio.to_thread(self._producer.flush, within)

    async def close(self, within: float = 30.0) -> None:
        """Flush (up to ``within`` seconds; the records still unacked then fail) and stop
        serving the delivery reports (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            if await self.flush(within):
                # not acked in time: failed (``_PURGE_QUEUE``), never left pending
                self._producer.purge()
                await self.flush(1.0)
        finally:
            self._stopping.set()
            await asyncio.to_thread(self._poller.join)


def _settle(fut: asyncio.Future[Delivered], outcome: Delivered | BaseException) -> None:
    if fut.done():
        return
    if isinstance(outcome, BaseException):
        fut.set_exception(outcome)
    else:
        fut.set_result(outcome)


# -- reading ------------------------------------------------------------------------------------


def reader(brokers: Brokers, group_id: str, settings: Mapping[str, Any] | None = None) -> Consumer:
    """A consumer for ``assign`` (never subscribes, commits nothing; ``group_id`` names it
    only). ``settings`` add to or override ``connection.consumer_options``."""
    return Consumer(
        {
            **consumer_options(brokers, group_id),
            "enable.partition.eof": True,
            "log_level": 0,
            **(settings or {}),
        }
    )


def watermarks(
    consumer: Consumer, tps: Iterable[Where], timeout: float = 10.0
) -> dict[Where, tuple[int, int]]:
    """``(topic, partition) -> (low, high)``: the first retained offset and the end (the
    high watermark: the offset the next record gets). ``KafkaException`` when a broker does
    not answer within ``timeout``."""
    deadline = time.monotonic() + timeout
    out = {}
    for topic, partition in tps:
        while True:
            left = max(0.1, deadline - time.monotonic())
            try:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=left
                )
                break
            except KafkaException as exc:
                # a topic created a moment ago: its leader not known yet (asked again)
                err = exc.args[0] if exc.args else None
                leaderless = isinstance(err, KafkaError) and (
                    bool(err.retriable()) or err.code() in _LEADERLESS
                )
                if not leaderless or time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)
        out[(topic, partition)] = (int(low), int(high))
    return out


def read_to_end(
    consumer: Consumer,
    spans: Mapping[Where, tuple[int, int]],
    on_message: Callable[[Message], None],
    *,
    progress: Callable[[int], None] | None = None,
    batch: int = 1000,
) -> int:
    """Assign the partitions of ``spans`` (``(topic, partition) -> (start, end)``) at their
    start and hand every record below their end to ``on_message``, in order within each
    partition; returns how many. The consumer stays assigned, positioned past what it read
    (``enable.partition.eof`` must be on: a partition whose last offsets are transaction
    markers ends at its end-of-partition event). ``progress(records)`` after each batch."""
    todo = {where for where, (start, end) in spans.items() if end > start}
    consumer.assign([TopicPartition(t, p, spans[(t, p)][0]) for t, p in sorted(spans)])
    read = 0
    while todo:
        for m in consumer.consume(num_messages=batch, timeout=0.5):
            where = (str(m.topic()), int(m.partition() or 0))
            if where not in todo:
                continue
            end = spans[where][1]
            offset = int(m.offset() or 0)
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    if offset >= end:
                        todo.discard(where)
                    continue
                if err.fatal():
                    raise KafkaException(err)
                continue  # transient: librdkafka retries
            if offset < end:
                on_message(m)
                read += 1
            if offset >= end - 1:
                todo.discard(where)
        if progress is not None:
            progress(read)
    return read


def wait_topic(brokers: Brokers, topic: str, wait: float = 5.0) -> list[int]:
    """The partitions of ``topic``, asked again for up to ``wait`` seconds (a broker can
    leave a topic created a moment ago out of its metadata for a while); ``[]`` when it
    does not show by then. Raises what :func:`connection.list_topics` raises."""
    deadline = time.monotonic() + wait
    while True:
        parts = partitions_of(list_topics(brokers, max(1.0, wait)), topic)
        if parts or time.monotonic() >= deadline:
            return parts
        time.sleep(0.1)
