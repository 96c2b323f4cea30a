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
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

__all__ = ["Batch", "ConsumerThread", "Hooks"]

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
    """Records consumed in one ``consume()`` call (errors left out, logged)."""

    messages: Sequence[Message[Any, Any]]


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
    ) -> None:
        self._config = config
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
                got = consumer.consume(self.batch_size, 0.1)
                kept = [m for m in got if _usable(m)]
                if kept:
                    loop.call_soon_threadsafe(self.batches.put_nowait, Batch(kept))
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
        new = self._numbers(partitions)
        if not new:
            consumer.incremental_assign([])
            return
        parts = self._parts(new)
        consumer.incremental_assign(parts)
        consumer.pause(parts)  # until their journal partitions are restored
        self.partitions |= new
        self._hook(consumer, self._hooks.assigned(new), f"assigning partitions {sorted(new)}")

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        gone = self._numbers(partitions)
        self._hook(consumer, self._hooks.revoking(gone), f"revoking partitions {sorted(gone)}")
        self.partitions -= gone
        consumer.incremental_unassign(self._parts(gone))

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        gone = self._numbers(partitions)
        self._hook(consumer, self._hooks.lost(gone), f"dropping lost partitions {sorted(gone)}")
        self.partitions -= gone
        consumer.incremental_unassign(self._parts(gone))


def _usable(msg: Message[Any, Any]) -> bool:
    err = msg.error()
    if err is None:
        return True
    if err.code() != KafkaError._PARTITION_EOF:
        if err.fatal():
            raise KafkaException(err)
        log.warning("consumer: %s", err.str())
    return False
