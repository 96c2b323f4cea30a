"""Retry tiers on Kafka: failed sends parked on ``<prefix>.outbox.retry.<tier>`` until due,
then attempted again by the worker that owns their chat.

When a send fails with a retryable error and is left to the background (its inline retries
spent), the journal records it ``failed`` with ``retry_at`` and the worker parks a record of
it on the first tier at least as long as its backoff, or its ``RateLimitedError.retry_after``
(``botmesh.state.backoff.RETRY_TIERS``: 1 s, 5 s, 30 s, 1 min, 5 min, 10 min). The record is
keyed by the chat id (the tier topics have the inbound's partitions) and holds the send's key, its
attempts and ``retry_at``; an operator sees the waiting retries with topic tooling.

Each tier has its own consumer in the worker (a plain consumer, manually assigned the
partitions this worker owns, offsets committed to the group ``<prefix>.worker.retry``). A
partition's records are in due order (one tier, one delay), so the consumer keeps each
partition's records in a queue, pauses the partition while its head is not due, and
attempts the head when it is: waiting never blocks another tier, another partition or the
inbound. The journal stays the truth: a parked record whose send was meanwhile sent,
retried by an operator, discarded or retried already does nothing
(``Operations.retry_parked`` compares the state and the attempts). A record due later than
its tier's delay (past the last tier) is parked again on that tier until due. A retry
record lost (a crash between the journal write and the park) delays the send only: the
sweeper takes a parked send ``PARK_GRACE`` (30 s) after its ``retry_at``.

The consumers are librdkafka's (confluent-kafka): a synchronous ``Consumer`` per tier,
settings from ``connection.consumer_options`` (TLS and SASL included; auto-commit and the
offset store off, a partition without a committed offset read from its start), reading
``read_uncommitted`` (a record of an aborted
transaction is checked against the journal like any other, and a transaction left open never
holds up a tier). Each tier's asyncio task drives its consumer and makes every call to it (assign,
consume, pause, resume, commit, close) through a thread of the tier's own, one call at a
time: librdkafka wants one caller at a time on a consumer, a ``consume`` blocks for up to a
second, and the parked sends are attempted on the loop in between. Not
``confluent_kafka.aio.AIOConsumer``: it makes the same hop (a pool of up to 100 threads, the
calls on one consumer serialized) and adds nothing a tier needs. No rebalance is involved
(``assign``, never ``subscribe``): when the partitions this worker owns change, the consumer
is assigned the new set and reads each again from its committed offset. A partition is
paused with records queued and resumed once its queue is empty: librdkafka drops what it
prefetched for a paused partition and, on resume, fetches from the record after the last it
handed over, so nothing is read twice or skipped.

Per-chat order holds across retries: a later send of the chat is journaled behind the parked
one (``outbox.keep_chat_order``) and waits for it, not charged as an attempt; the parts of a
text wait for the part before them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaException, TopicPartition

from botmesh.state.backoff import RETRY_TIERS, tier_of
from botmesh.streams.connection import Brokers, consumer_options
from botmesh.topics import Catalog

__all__ = ["Parked", "RetryTiers", "parked_record"]

log = logging.getLogger("botmesh.retry")

#: How long a parked record that could not be attempted (journal trouble, a rebalance)
#: waits before the next try.
AGAIN_S = 1.0
#: The most records one ``consume`` hands over.
BATCH = 500

_T = TypeVar("_T")
#: One partition's queue: ``(offset, due, parked)`` of each record read and not attempted.
_Queue = collections.deque[tuple[int, float, "Parked | None"]]


@dataclass(frozen=True, slots=True)
class Parked:
    """One parked send, as read from its tier."""

    key: str
    chat_id: str
    attempts: int
    retry_at: float


def parked_record(
    value: dict[str, Any], retry_at: float
) -> tuple[str, bytes, bytes, list[tuple[str, bytes]]]:
    """Tier, key, value and headers of the retry record of a failed send (its journaled
    ``value``), due at ``retry_at``."""
    tier = tier_of(retry_at - time.time())
    payload = value.get("payload") or {}
    chat = str(payload.get("chat_id", ""))
    error = value.get("error") or {}
    body = {
        "v": 1,
        "key": value["key"],
        "chat_id": chat,
        "attempts": int(value.get("attempts", 0)),
        "retry_at": retry_at,
        "tier": tier,
        "error": {"type": error.get("type"), "message": error.get("message")},
    }
    headers = [
        ("tier", tier.encode()),
        ("retry.at", f"{retry_at:.3f}".encode()),
        ("attempts", str(body["attempts"]).encode()),
        ("idempotency.key", str(value["key"]).encode()),
    ]
    return tier, chat.encode(), json.dumps(body, separators=(",", ":")).encode(), headers


def _parked(raw: bytes | None) -> Parked | None:
    try:
        v = json.loads(raw or b"")
        return Parked(str(v["key"]), str(v["chat_id"]), int(v["attempts"]), float(v["retry_at"]))
    except (ValueError, KeyError, TypeError):
        return None


class RetryTiers:
    """The tier consumers of one worker.

    ``owned()`` gives the partitions (of the inbound, so of the journal and the tiers) this
    worker owns now; ``retry(partition, parked)`` attempts a parked send in its journal
    partition (``"delivered"``, ``"waiting"`` or ``"stale"``); ``repark(parked, tier)``
    produces a record due past its tier's delay to that tier again.
    """

    def __init__(
        self,
        bootstrap: Brokers,
        cat: Catalog,
        owned: Callable[[], set[int]],
        retry: Callable[[int, Parked], Awaitable[str]],
        repark: Callable[[Parked, str], Awaitable[Any]],
    ) -> None:
        self._bootstrap = bootstrap
        self._cat = cat
        self._owned = owned
        self._retry = retry
        self._repark = repark
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()
        #: Sends parked on each tier and not attempted yet, in the partitions this worker
        #: owns: read and waiting, and behind them up to the tier's end (as last fetched).
        self.parked: dict[str, int] = {}
        #: Parked records attempted, by outcome (``delivered``, ``waiting``, ``stale``,
        #: ``reparked``, ``bad``).
        self.outcomes: collections.Counter[str] = collections.Counter()

    @property
    def group(self) -> str:
        return self._cat.retry_group

    def start(self) -> None:
        self._stopping.clear()
        for name, seconds in RETRY_TIERS:
            self._tasks.append(
                asyncio.get_running_loop().create_task(
                    self._run(name, seconds), name=f"botmesh-retry-{name}"
                )
            )

    async def stop(self, grace: float = 10.0) -> None:
        """Stop taking records; an attempt in progress is let finish (up to ``grace``)."""
        self._stopping.set()
        tasks, self._tasks = self._tasks, []
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _run(self, tier: str, seconds: float) -> None:
        topic = self._cat.retry(tier)
        thread = ThreadPoolExecutor(1, thread_name_prefix=f"botmesh-retry-{tier}")
        tc: _TierConsumer | None = None
        try:
            while tc is None and not self._stopping.is_set():
                try:
                    consumer = await asyncio.get_running_loop().run_in_executor(
                        thread, self._consumer
                    )
                except Exception as exc:  # settings librdkafka refuses (a certificate file)
                    log.warning(
                        "retry tier %s: cannot make its consumer (%s); trying again", tier, exc
                    )
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), AGAIN_S * 5)
                else:
                    tc = _TierConsumer(consumer, thread, topic)
            if tc is not None:
                await self._consume(tc, tier, seconds)
        except Exception:
            log.exception("retry tier %s stopped; the sweeper retries its sends", tier)
        finally:
            if tc is not None:  # after the call running now (a consume of 1 s at most)
                with contextlib.suppress(Exception):
                    await tc.call(tc.consumer.close)
            thread.shutdown(wait=False)

    def _consumer(self) -> Consumer:
        return Consumer(
            {
                **consumer_options(self._bootstrap, self.group),
                "isolation.level": "read_uncommitted",
                # librdkafka's errors through Python's logging, served inside consume()
                "logger": logging.getLogger("botmesh.retry.librdkafka"),
                "log_level": 3,
            }
        )

    async def _consume(self, tc: _TierConsumer, tier: str, seconds: float) -> None:
        queues: dict[int, _Queue] = {}
        not_before: dict[int, float] = {}
        assigned: set[int] = set()
        while not self._stopping.is_set():
            owned = self._owned()
            if owned != assigned:
                await tc.call(tc.consumer.assign, tc.tps(sorted(owned)))
                queues = {p: collections.deque() for p in owned}  # read again from committed
                assigned = owned
            now = time.time()
            for p, queue in queues.items():
                if not_before.get(p, 0.0) > now:
                    continue
                while queue and queue[0][1] <= now and not self._stopping.is_set():
                    offset, _, parked = queue[0]
                    if not await self._attempt(p, parked, tier):
                        not_before[p] = now + AGAIN_S
                        break
                    queue.popleft()
                    await tc.commit(p, offset + 1, tier)
            waiting = [p for p, q in queues.items() if q]
            if waiting:
                await tc.call(tc.consumer.pause, tc.tps(waiting))
            # resumed every round: a partition paused before stays paused across assign(),
            # and resuming one that is not paused loses nothing librdkafka prefetched
            free = [p for p, q in queues.items() if not q]
            if free:
                await tc.call(tc.consumer.resume, tc.tps(free))
            self.parked[tier] = await tc.call(_waiting, tc.consumer, tc.topic, queues)
            heads = [max(q[0][1], not_before.get(p, 0.0)) for p, q in queues.items() if q]
            wait = min([1.0, *(h - now for h in heads)])
            if not assigned:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), 1.0)
                continue
            batch = await tc.call(tc.consumer.consume, BATCH, max(0.01, wait))
            for m in batch:
                err = m.error()
                if err is not None:
                    if err.fatal():
                        raise KafkaException(err)
                    log.debug("retry tier %s: %s", tier, err.str())
                    continue
                pending = queues.get(int(m.partition() or 0))
                if pending is None:
                    continue
                parked = _parked(m.value())
                # due at its retry time, or at its tier's delay to be parked again
                wake = (m.timestamp()[1] / 1000.0) + seconds
                due = min(parked.retry_at, wake) if parked is not None else 0.0
                pending.append((int(m.offset() or 0), due, parked))

    async def _attempt(self, partition: int, parked: Parked | None, tier: str) -> bool:
        """One due record; ``False`` when it must be tried again later."""
        if parked is None:
            log.warning("retry tier %s: a record that is not a parked send; skipped", tier)
            self.outcomes["bad"] += 1
            return True
        try:
            if parked.retry_at > time.time() + 0.001:  # past the tier's delay: park again
                await self._repark(parked, tier)
                self.outcomes["reparked"] += 1
                return True
            outcome = await self._retry(partition, parked)
        except Exception as exc:
            log.warning(
                "retry tier %s: send %s not attempted yet (%s: %s)",
                tier,
                parked.key,
                type(exc).__name__,
                exc,
            )
            return False
        self.outcomes[outcome] += 1
        return True


class _TierConsumer:
    """A tier's consumer and the one thread every call to it is made from."""

    def __init__(self, consumer: Consumer, thread: ThreadPoolExecutor, topic: str) -> None:
        self.consumer = consumer
        self.topic = topic
        self._thread = thread

    def tps(self, partitions: list[int]) -> list[TopicPartition]:
        return [TopicPartition(self.topic, p) for p in partitions]

    async def call(self, fn: Callable[..., _T], *args: Any) -> _T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, functools.partial(fn, *args))

    async def commit(self, partition: int, offset: int, tier: str) -> None:
        """Commit ``offset`` (the next record's) on ``partition``. A refusal is logged, not
        raised: the record was attempted, the partition's next commit covers it, and a
        record read again meanwhile is answered ``stale`` by the journal."""
        try:
            [done] = await self.call(self._commit, TopicPartition(self.topic, partition, offset))
            error: object = done.error
        except KafkaException as exc:
            error = exc
        if error is not None:
            log.warning(
                "retry tier %s: offset %d of partition %d not committed (%s)",
                tier,
                offset,
                partition,
                error,
            )

    def _commit(self, tp: TopicPartition) -> list[TopicPartition]:
        return self.consumer.commit(offsets=[tp], asynchronous=False)


def _waiting(consumer: Consumer, topic: str, queues: dict[int, _Queue]) -> int:
    """Sends parked and not attempted yet: those queued and, behind each queue, up to the
    partition's end as last fetched (librdkafka's cached high watermark)."""
    n = 0
    for p, queue in queues.items():
        n += len(queue)
        if not queue:
            continue
        _, end = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)
        if end >= 0:  # read as far as the last queued record
            n += max(end - queue[-1][0] - 1, 0)
    return n
