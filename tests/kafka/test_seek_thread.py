"""Faust's ``Consumer.seek`` on a real broker: aiokafka's consumer drained on its own thread
(as Faust's consumer thread does) while the event loop seeks it.

Faust's seek calls the consumer from the event loop's thread; the seek deletes the
partition's buffered records while the consumer's thread is draining them, and aiokafka's
``fetched_records`` raises ``KeyError`` (on CI it crashed a worker's fetcher, the worker
exited). ``seek_in_consumer_thread`` makes the seek on the consumer's thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from faust.transport.consumer import ThreadDelegateConsumer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread, Consumer

from botmesh.streams.faust_app.defects import _ORIGINAL_THREAD_SEEK, seek_in_consumer_thread
from tests.kafka.broker import create_topics

pytestmark = pytest.mark.kafka

RECORDS = 10_000  # enough that a fetch returns big batches, drained again after each seek


class DrainThread:
    """An aiokafka consumer on its own thread and event loop, fetching one partition over
    and over from the beginning (it is sought back there), with what Faust's consumer
    thread offers the seek: ``call_thread`` (run a function on the thread, await its
    result), ``_ensure_consumer`` and Faust's own ``seek``."""

    seek = AIOKafkaConsumerThread.seek

    def __init__(self, bootstrap: str, tp: TopicPartition) -> None:
        self.bootstrap, self.tp = bootstrap, tp
        self.errors: list[BaseException] = []
        self.drained = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.consumer: AIOKafkaConsumer | None = None

    def __enter__(self) -> DrainThread:
        self._thread.start()
        assert self._ready.wait(60), "the consumer's thread did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    async def _main(self) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            consumer.assign([self.tp])
            self.loop, self.consumer = asyncio.get_running_loop(), consumer
            self._ready.set()
            while not self._stop.is_set():
                try:
                    got = await consumer.getmany(self.tp, timeout_ms=50)
                except Exception as exc:  # what Faust's fetcher would crash on
                    self.errors.append(exc)
                else:
                    self.drained += sum(len(batch) for batch in got.values())
        finally:
            await consumer.stop()

    def _ensure_consumer(self) -> AIOKafkaConsumer:
        assert self.consumer is not None
        return self.consumer

    async def call_thread(self, fun: Callable[..., Any], *args: Any) -> Any:
        async def call() -> Any:
            result = fun(*args)
            return await result if isinstance(result, Awaitable) else result

        assert self.loop is not None
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call(), self.loop))


@pytest.fixture
def partition(kafka_bootstrap: str, topic_prefix: str) -> Iterator[TopicPartition]:
    topic = f"{topic_prefix}.seek"
    create_topics(kafka_bootstrap, [topic], partitions=1)

    async def fill() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=5)
        await producer.start()
        try:
            for _ in range(RECORDS):
                await producer.send(topic, b"x" * 50, partition=0)
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(fill())
    yield TopicPartition(topic, 0)


async def seek_while_draining(
    drain: DrainThread, seek: Callable[..., Awaitable[None]], *, seeks: int, limit_s: float
) -> int:
    """Seek the partition back to 0 through Faust's ``ThreadDelegateConsumer._seek`` (as
    ``seek``) every 2 ms while the thread drains it; stop after ``seeks`` seeks, ``limit_s``
    seconds, or the thread's first error. Returns how many seeks were made."""
    delegate = Consumer.__new__(Consumer)  # Faust's aiokafka consumer (a ThreadDelegateConsumer)
    delegate._thread = drain  # type: ignore[assignment]
    deadline = time.monotonic() + limit_s
    made = 0
    while made < seeks and time.monotonic() < deadline and not drain.errors:
        await seek(delegate, drain.tp, 0)
        made += 1
        await asyncio.sleep(0.002)
    return made


async def test_a_seek_from_the_event_loop_breaks_the_consumer_thread_unless_made_on_it(
    kafka_bootstrap: str, partition: TopicPartition
) -> None:
    with DrainThread(kafka_bootstrap, partition) as drain:
        # Faust's own seek: the thread's drain failed within 5-12 seeks here
        made = await seek_while_draining(drain, _ORIGINAL_THREAD_SEEK, seeks=50_000, limit_s=60)
        assert drain.errors, f"{made} seeks from the event loop, no error in the drain"
        assert isinstance(drain.errors[0], KeyError), drain.errors[0]
        print(f"Faust's seek: the drain raised {drain.errors[0]!r} after {made} seeks")
    with DrainThread(kafka_bootstrap, partition) as drain:
        seek_in_consumer_thread()
        made = await seek_while_draining(
            drain, ThreadDelegateConsumer._seek, seeks=1_000, limit_s=60
        )
        assert made == 1_000
        assert drain.errors == []
        assert drain.drained > RECORDS  # it kept fetching, from 0 again after the seeks
        print(f"the worker's seek: {made} seeks, no error, {drain.drained} records drained")
