"""The worker's one consumer, driven from a thread of its own, and its rebalances.

librdkafka's consumer takes one call at a time (a ``commit()`` from another thread waits
for a running ``consume()``), and its rebalance callbacks run inside ``consume()`` on the
calling thread (``tests/kafka/test_librdkafka_facts.py``). So one thread owns the consumer:
it consumes batches and hands them to the event loop, and runs what the loop asks of the
consumer (commit, pause, resume, the group's metadata) between two ``consume()`` calls,
each answered through a future.

**Co-partitioned.** The consumer subscribes to the inbound topic alone (cooperative-sticky
assignment: a rebalance moves only the partitions that change hands). In its callbacks it
adds, and takes away, the same partitions of the side topics (``<prefix>.requests``,
``<prefix>.control``): the assignor does not co-partition two topics, and a chat's requests
and operator actions must reach the worker that owns its journal partition.

**Rebalances.** ``on_assign`` assigns the new partitions paused and hands their numbers to
the loop (``Hooks.assigned``: restore the journal partitions, then ``resume``);
``on_revoke`` first lets the loop finish with the partitions (``Hooks.revoking``: settle
or give up what is in flight, a last checkpoint of them), then unassigns them;
``on_lost`` (the group moved on without this member: a session that expired) unassigns at
once after ``Hooks.lost``, which must commit nothing. The thread waits for each hook, at
most ``hook_timeout`` seconds (a rebalance cannot be held for ever: past it, the
partitions are dropped and the hook's error logged).

**Leaving.** ``close(leave=False)`` (a restart, a crash's successor: the static member's
partitions wait for it through the session timeout) closes the consumer without a
LeaveGroup; ``close(leave=True)`` (a scale-down) unsubscribes, serves the revoke, then
closes, so the partitions move at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

__all__ = ["Batch", "ConsumerThread", "Hooks", "generation_of"]

log = logging.getLogger("botmesh.streams")


class Hooks(Protocol):
    """What the consumer's rebalances ask of the worker (each awaited on the event loop)."""

    async def assigned(self, partitions: set[int]) -> None:
        """Partitions given to this worker (paused: resume them once their journal
        partitions are restored)."""

    async def revoking(self, partitions: set[int]) -> None:
        """Partitions about to be taken away, still this worker's: finish with them."""

    async def lost(self, partitions: set[int]) -> None:
        """Partitions already someone else's: drop them, commit nothing of them."""


@dataclass(frozen=True)
class Batch:
    """Records consumed in one ``consume()`` call (errors left out, logged), and the
    consumer's ``epoch`` when they were: a batch fetched before a partition was taken away
    (or given again) can reach the loop after its hook ran."""

    messages: Sequence[Message[Any, Any]]
    epoch: int = 0


#: Seconds between two samples of the consumer's lag.
LAG_EVERY_S = 1.0

_Call = tuple[Callable[[Consumer], Any], concurrent.futures.Future[Any]]


class ConsumerThread:
    """The consumer of ``topic`` (and ``side`` topics, co-partitioned) in a thread; batches
    go to ``batches`` on ``loop``."""

    def __init__(
        self,
        config: dict[str, Any],
        topic: str,
        side: Sequence[str],
        hooks: Hooks,
        *,
        batch_size: int = 500,
        hook_timeout: float = 120.0,
        on_generation: Callable[[int], None] | None = None,
    ) -> None:
        self._config = config
        self._on_generation = on_generation
        self.topic = topic
        self.side = tuple(side)
        self._hooks = hooks
        self.batch_size = batch_size
        self.hook_timeout = hook_timeout
        self.batches: asyncio.Queue[Batch] = asyncio.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._consumer: Consumer | None = None
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._leave = False
        self._thread: threading.Thread | None = None
        self._closed: asyncio.Future[None] | None = None
        #: The inbound partitions this consumer has now (the loop reads it).
        self.partitions: set[int] = set()
        #: One more at each assignment or revocation of partitions (read by the hooks, which
        #: run while this thread waits; each ``Batch`` carries the epoch it was fetched in).
        self.epoch = 0
        #: True from a revoke (or a loss) to the assignment that ends the rebalance, and while
        #: an assignment is taken up (``/readyz``).
        self.rebalancing = False
        #: The group member id as of the last ``consume()`` (empty before the join).
        self.member_id = ""
        #: The group's generation as of the last rebalance callback (-1 before the join).
        self.generation = -1
        #: Records between each consumed partition's position and its end (``/metrics``),
        #: from the offsets librdkafka last fetched; refreshed every ``LAG_EVERY_S``.
        self.lag: dict[tuple[str, int], int] = {}
        self._lag_at = 0.0
        self._committed: dict[tuple[str, int], int] = {}

    # -- the loop's side -----------------------------------------------------------------

    async def start(self) -> None:
        """Create the consumer, subscribe, and start the thread."""
        loop = self._loop = asyncio.get_running_loop()
        self._closed = loop.create_future()
        self._consumer = Consumer(self._config)
        self._consumer.subscribe(
            [self.topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        self._thread = threading.Thread(target=self._run, name="botmesh-consumer", daemon=True)
        self._thread.start()

    async def call(self, fn: Callable[[Consumer], Any]) -> Any:
        """Run ``fn(consumer)`` on the consumer's thread, between two ``consume()`` calls."""
        if self._thread is None or not self._thread.is_alive():
            raise RuntimeError("the consumer is not running")
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._calls.put((fn, done))
        return await asyncio.wrap_future(done)

    async def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        """Commit ``offsets`` (topic, partition -> next offset to read) synchronously;
        only partitions this consumer still has (a revoked one is the new owner's)."""

        def commit(consumer: Consumer) -> None:
            mine = {(tp.topic, tp.partition) for tp in consumer.assignment()}
            tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items() if (t, p) in mine]
            if tps:
                consumer.commit(offsets=tps, asynchronous=False)

        await self.call(commit)

    async def resume(self, partitions: set[int]) -> None:
        """Start fetching ``partitions`` (of every topic) again."""
        await self.call(lambda c: c.resume(self._parts(partitions)))

    async def pause(self, partitions: set[int]) -> None:
        """Stop fetching ``partitions`` (of every topic) for now."""
        await self.call(lambda c: c.pause(self._parts(partitions)))

    async def group_metadata(self) -> Any:
        """The consumer's current group metadata (its generation: EOS v2's offsets)."""
        return await self.call(lambda c: c.consumer_group_metadata())

    async def close(self, *, leave: bool = False) -> None:
        """Stop the thread and close the consumer (``leave``: hand the partitions over at
        once; else, a static member's keep them through the session timeout)."""
        self._leave = leave
        self._stop.set()
        if self._closed is not None:
            await asyncio.shield(self._closed)

    # -- the consumer's thread -----------------------------------------------------------

    def _parts(self, partitions: set[int]) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t in (self.topic, *self.side) for p in partitions]

    def _serve_calls(self, consumer: Consumer) -> None:
        while True:
            try:
                fn, done = self._calls.get_nowait()
            except queue.Empty:
                return
            if not done.set_running_or_notify_cancel():
                continue
            try:
                done.set_result(fn(consumer))
            except BaseException as exc:
                done.set_exception(exc)

    def _run(self) -> None:
        consumer = self._consumer
        loop = self._loop
        assert consumer is not None and loop is not None
        try:
            while not self._stop.is_set():
                self._serve_calls(consumer)
                got = self._take(consumer)
                kept = [m for m in got if _usable(m)]
                if kept:
                    loop.call_soon_threadsafe(self.batches.put_nowait, Batch(kept, self.epoch))
                self._refresh(consumer)
            self._serve_calls(consumer)
            if self._leave:  # a LeaveGroup needs the revoke served before close()
                consumer.unsubscribe()
                deadline = time.monotonic() + self.hook_timeout
                while self.partitions and time.monotonic() < deadline:
                    consumer.consume(self.batch_size, 0.1)
            consumer.close()
        except BaseException as exc:
            log.exception("the consumer's thread failed")
            self._finish(exc)
            return
        finally:
            self._fail_calls()
        self._finish(None)

    def _take(self, consumer: Consumer) -> list[Message[Any, Any]]:
        """What is there, up to ``batch_size`` records, at once; when nothing is, the first
        record within 0.1 s and what came with it. (``consume(n, timeout)`` waits out its
        whole timeout unless ``n`` records arrive: 100 ms added to a record at a low rate.)"""
        got = consumer.consume(self.batch_size, 0)
        if got:
            return got
        first = consumer.poll(0.1)
        if first is None:
            return []
        return [first, *consumer.consume(self.batch_size - 1, 0)]

    def _refresh(self, consumer: Consumer) -> None:
        """The member id and, every ``LAG_EVERY_S``, the lag (both read by the loop): each
        assigned partition's end (as last fetched) less where this consumer stands in it
        (its position; before it read anything there, the committed offset, else the
        partition's start)."""
        self.member_id = consumer.memberid() or ""
        now = time.monotonic()
        if now - self._lag_at < LAG_EVERY_S:
            return
        self._lag_at = now
        lag: dict[tuple[str, int], int] = {}
        try:
            positions = consumer.position(consumer.assignment())
            unknown = [
                TopicPartition(tp.topic, tp.partition)
                for tp in positions
                if tp.offset < 0 and (tp.topic, tp.partition) not in self._committed
            ]
            if unknown:  # asked once a partition (a commit of it gives it a position)
                for tp in consumer.committed(unknown, timeout=5.0):
                    self._committed[(tp.topic, tp.partition)] = tp.offset
            for tp in positions:
                low, high = consumer.get_watermark_offsets(tp, cached=True)
                at = (
                    tp.offset
                    if tp.offset >= 0
                    else self._committed.get((tp.topic, tp.partition), -1)
                )
                at = at if at >= 0 else low
                if high >= 0 and at >= 0:
                    lag[(tp.topic, tp.partition)] = max(high - at, 0)
        except KafkaException as exc:  # a sample skipped: the next one comes
            log.debug("consumer lag not read: %s", exc)
            return
        self.lag = lag

    def _finish(self, exc: BaseException | None) -> None:
        loop, closed = self._loop, self._closed
        if loop is None or closed is None:
            return

        def done() -> None:
            if closed.done():
                return
            if exc is None:
                closed.set_result(None)
            else:
                closed.set_exception(exc)

        with contextlib.suppress(RuntimeError):  # the loop closed first
            loop.call_soon_threadsafe(done)

    def _fail_calls(self) -> None:
        while True:
            try:
                _, done = self._calls.get_nowait()
            except queue.Empty:
                return
            if done.set_running_or_notify_cancel():
                done.set_exception(RuntimeError("the consumer stopped"))

    def _hook(self, consumer: Consumer, run: Awaitable[None], what: str) -> None:
        """Run a hook on the loop and wait for it (bounded): the rebalance waits too.
        Meanwhile this thread serves the loop's calls (the hook's own: a resume, a commit),
        as the callback may call the consumer and no other thread can while it runs."""
        loop = self._loop
        assert loop is not None

        async def wrapped() -> None:
            await run

        future = asyncio.run_coroutine_threadsafe(wrapped(), loop)
        deadline = time.monotonic() + self.hook_timeout
        while True:
            self._serve_calls(consumer)
            try:
                future.result(0.02)
                return
            except concurrent.futures.TimeoutError:
                if time.monotonic() < deadline:
                    continue
                future.cancel()
                log.error("%s took longer than %gs; the rebalance goes on", what, self.hook_timeout)
                return
            except Exception:
                log.exception("%s failed; the rebalance goes on", what)
                return

    def _numbers(self, partitions: list[TopicPartition]) -> set[int]:
        return {tp.partition for tp in partitions if tp.topic == self.topic}

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # every rebalance ends here (with nothing new, under the cooperative protocol)
        self.rebalancing = True
        try:
            self._assign(consumer, partitions)
        finally:
            self.rebalancing = False

    def _assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # read before the hooks: a restore can hold this thread for long (the membership
        # check asks the coordinator about this member id meanwhile)
        self.member_id = consumer.memberid() or ""
        generation = generation_of(consumer.consumer_group_metadata())
        new = self._numbers(partitions)
        if generation != self.generation:
            self.generation = generation
            self._committed.clear()
            log.info(
                "group generation %d: partitions %s of %s assigned, %s held",
                generation,
                sorted(new),
                self.topic,
                sorted(self.partitions),
            )
            if self._on_generation is not None:
                self._on_generation(generation)
        if not new:
            consumer.incremental_assign([])
            return
        parts = self._parts(new)
        self.epoch += 1
        consumer.incremental_assign(parts)
        consumer.pause(parts)  # until their journal partitions are restored
        self.partitions |= new
        self._hook(consumer, self._hooks.assigned(new), f"assigning partitions {sorted(new)}")

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # rebalancing until the assignment that ends the rebalance (the cooperative
        # protocol's second round), or the close
        self.rebalancing = True
        gone = self._numbers(partitions)
        self.epoch += 1
        self._hook(consumer, self._hooks.revoking(gone), f"revoking partitions {sorted(gone)}")
        self.partitions -= gone
        consumer.incremental_unassign(self._parts(gone))

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.rebalancing = True  # the rejoin's assignment ends it
        gone = self._numbers(partitions)
        self.epoch += 1
        self._hook(consumer, self._hooks.lost(gone), f"dropping lost partitions {sorted(gone)}")
        self.partitions -= gone
        consumer.incremental_unassign(self._parts(gone))


def generation_of(metadata: object) -> int:
    """The group generation in a consumer's group metadata: librdkafka hands it over
    serialised (``rd_kafka_consumer_group_metadata_write``: ``CGMDv2:``, then the
    generation id as a 32-bit integer in the machine's byte order, then the group id
    and the member ids), opaque to the binding; -1 when it is not in that shape."""
    raw = metadata if isinstance(metadata, bytes) else b""
    if not raw.startswith(_CGMD) or len(raw) < len(_CGMD) + 4:
        return -1
    at = len(_CGMD)
    return int.from_bytes(raw[at : at + 4], sys.byteorder, signed=True)


_CGMD = b"CGMDv2:"


def _usable(msg: Message[Any, Any]) -> bool:
    err = msg.error()
    if err is None:
        return True
    if err.code() != KafkaError._PARTITION_EOF:
        if err.fatal():
            raise KafkaException(err)
        log.warning("consumer: %s", err.str())
    return False
