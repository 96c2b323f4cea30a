"""The retry tiers' consumers (``botmesh.streams.retry_tiers.RetryTiers``) on a real broker,
driven directly: parked records produced to a tier's topic, the worker's side given as plain
callables (``owned``, ``retry``, ``repark``).

A parked send is attempted once, never before its ``retry_at``, in its partition's order;
its offset is then committed to ``<prefix>.worker.retry``; a record due past its tier's delay
is parked again; a record that is not a parked send is skipped; an attempt that fails is
made again (nothing committed meanwhile); a partition this worker does not own is not read
until it is, and a restarted worker reads on from the committed offsets. The tests in
``test_dlq.py`` run the same tiers inside a real worker process.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from confluent_kafka import Producer

from botmesh.state.backoff import RETRY_TIERS
from botmesh.streams.connection import producer_options
from botmesh.streams.retry_tiers import Parked, RetryTiers, parked_record
from botmesh.topics import Catalog
from tests.kafka.broker import committed_offsets, create_topics, end_offsets

pytestmark = pytest.mark.kafka

PARTITIONS = 2
#: How long a condition may take before the test fails (a generous bound, not a measure).
WAIT_S = 60.0


@dataclass
class Worker:
    """The worker's side of the tiers: which partitions it owns, and what it was asked."""

    owned: set[int] = field(default_factory=lambda: {0, 1})
    attempts: list[tuple[int, Parked, float]] = field(default_factory=list)
    reparked: list[tuple[Parked, str]] = field(default_factory=list)
    #: keys whose next attempt raises (once each)
    failing: set[str] = field(default_factory=set)

    def owns(self) -> set[int]:
        return set(self.owned)

    async def retry(self, partition: int, parked: Parked) -> str:
        self.attempts.append((partition, parked, time.time()))
        if parked.key in self.failing:
            self.failing.discard(parked.key)
            raise ConnectionError("journal unavailable")
        return "delivered"

    async def repark(self, parked: Parked, tier: str) -> None:
        self.reparked.append((parked, tier))

    def sends(self, partition: int | None = None) -> list[str]:
        return [p.key for part, p, _ in self.attempts if partition in (None, part)]


def park(bootstrap: str, topic: str, partition: int, key: str, retry_at: float) -> None:
    """Produce the retry record of send ``key`` (chat ``c-<key>``), due at ``retry_at``."""
    value = {"key": key, "payload": {"chat_id": f"c-{key}"}, "attempts": 1, "error": {}}
    _, chat, body, headers = parked_record(value, retry_at)
    producer = Producer(producer_options(bootstrap))
    producer.produce(topic, body, chat, partition, headers=headers)  # type: ignore[arg-type]
    assert producer.flush(30) == 0


def produce_raw(bootstrap: str, topic: str, partition: int, value: bytes) -> None:
    producer = Producer(producer_options(bootstrap))
    producer.produce(topic, value, b"x", partition)
    assert producer.flush(30) == 0


async def until(cond: Callable[[], bool], what: str) -> None:
    """Wait for ``cond()`` (asked in a thread: it may ask the broker) up to ``WAIT_S``."""
    deadline = time.monotonic() + WAIT_S
    while not await asyncio.to_thread(cond):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_S} s: {what}")
        await asyncio.sleep(0.05)


def tiers_of(bootstrap: str, prefix: str) -> Catalog:
    cat = Catalog(prefix)
    create_topics(bootstrap, [cat.retry(name) for name, _ in RETRY_TIERS], PARTITIONS)
    return cat


def committed(bootstrap: str, cat: Catalog, topic: str) -> dict[int, int]:
    return {
        p: offset
        for (t, p), offset in committed_offsets(bootstrap, cat.retry_group).items()
        if t == topic
    }


async def test_parked_sends_are_attempted_once_when_due_in_order_and_committed(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    cat = tiers_of(kafka_bootstrap, topic_prefix)
    topic = cat.retry("1s")
    now = time.time()
    due = {"a1": now + 0.5, "a2": now + 0.8, "b1": now + 0.6}
    park(kafka_bootstrap, topic, 0, "a1", due["a1"])
    park(kafka_bootstrap, topic, 0, "a2", due["a2"])
    park(kafka_bootstrap, topic, 1, "b1", due["b1"])
    produce_raw(kafka_bootstrap, topic, 1, b"not a parked send")
    park(kafka_bootstrap, topic, 1, "later", now + 60.0)  # past the 1 s tier: parked again
    worker = Worker(failing={"a2"})
    tiers = RetryTiers(kafka_bootstrap, cat, worker.owns, worker.retry, worker.repark)
    tiers.start()
    try:
        await until(
            lambda: sorted(set(worker.sends())) == ["a1", "a2", "b1"] and len(worker.reparked) == 1,
            "every parked send attempted",
        )
        await until(
            lambda: committed(kafka_bootstrap, cat, topic) == end_offsets(kafka_bootstrap, topic),
            "the tier's offsets committed to its end",
        )
        await until(lambda: tiers.parked.get("1s") == 0, "nothing left parked on the tier")
    finally:
        await tiers.stop()
    # a2 failed once and was attempted again; the others once each, in partition order
    assert worker.sends(0) == ["a1", "a2", "a2"] and worker.sends(1) == ["b1"]
    for _, parked, at in worker.attempts:
        assert at >= parked.retry_at, parked.key
        assert parked.chat_id == f"c-{parked.key}" and parked.attempts == 1
    [(again, tier)] = worker.reparked
    assert (again.key, tier) == ("later", "1s")
    assert tiers.outcomes == {"delivered": 3, "reparked": 1, "bad": 1}
    assert tiers.group == f"{topic_prefix}.worker.retry"


async def test_only_owned_partitions_are_read_and_a_restart_reads_on_from_the_committed(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    cat = tiers_of(kafka_bootstrap, topic_prefix)
    topic = cat.retry("1s")
    now = time.time()
    park(kafka_bootstrap, topic, 0, "p0-1", now)
    park(kafka_bootstrap, topic, 1, "p1-1", now)
    worker = Worker(owned={0})
    tiers = RetryTiers(kafka_bootstrap, cat, worker.owns, worker.retry, worker.repark)
    tiers.start()
    try:
        await until(lambda: worker.sends() == ["p0-1"], "the owned partition's send attempted")
        await until(
            lambda: committed(kafka_bootstrap, cat, topic) == {0: 1}, "partition 0 committed"
        )
        # the partition given to this worker later: read from its committed offset (none)
        worker.owned = {0, 1}
        await until(lambda: worker.sends() == ["p0-1", "p1-1"], "the new partition's send")
        await until(
            lambda: committed(kafka_bootstrap, cat, topic) == {0: 1, 1: 1}, "both committed"
        )
    finally:
        await tiers.stop()
    # a restarted worker attempts only what was parked since
    park(kafka_bootstrap, topic, 1, "p1-2", time.time())
    restarted = Worker()
    tiers = RetryTiers(kafka_bootstrap, cat, restarted.owns, restarted.retry, restarted.repark)
    tiers.start()
    try:
        await until(lambda: restarted.sends() == ["p1-2"], "the send parked since attempted")
        await until(lambda: committed(kafka_bootstrap, cat, topic) == {0: 1, 1: 2}, "committed on")
    finally:
        await tiers.stop()
    assert restarted.sends() == ["p1-2"]


async def test_a_head_not_due_holds_up_neither_the_other_partition_nor_the_other_tiers(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    cat = tiers_of(kafka_bootstrap, topic_prefix)
    now = time.time()
    slow = now + 3600.0  # past the 10 min tier's delay too: waits for its tier's delay
    park(kafka_bootstrap, cat.retry("10m"), 0, "slow", slow)
    park(kafka_bootstrap, cat.retry("10m"), 0, "behind", now)
    park(kafka_bootstrap, cat.retry("10m"), 1, "other-partition", now)
    park(kafka_bootstrap, cat.retry("1s"), 0, "other-tier", now)
    worker = Worker()
    tiers = RetryTiers(kafka_bootstrap, cat, worker.owns, worker.retry, worker.repark)
    tiers.start()
    try:
        await until(
            lambda: sorted(worker.sends()) == ["other-partition", "other-tier"],
            "the sends not behind the waiting head attempted",
        )
        # the waiting head and the record behind it are counted as parked
        await until(lambda: tiers.parked.get("10m") == 2, "two sends parked on the 10 min tier")
    finally:
        await tiers.stop()
    assert "slow" not in worker.sends() and "behind" not in worker.sends()
    assert committed(kafka_bootstrap, cat, cat.retry("10m")) == {1: 1}
