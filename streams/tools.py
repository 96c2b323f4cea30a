"""Operator tools on aiokafka: demo traffic for the inbound topic, a tail of the receipts,
and the worker's journal read back from its changelog.

Used by ``botmesh produce``, ``botmesh receipts``, ``examples/demo.py``, the tests and the
benchmark.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from aiokafka import (
    AIOKafkaConsumer,
    AIOKafkaProducer,
    TopicPartition,
)

from state.kv import Entry
from state.messages import Inbound, Receipt
from streams.table_kv import decode_entry
from topics.records import chat_key, decode_receipt, encode_inbound

__all__ = [
    "Seen",
    "demo_records",
    "end_offsets",
    "produce_inbound",
    "read_journal",
    "tail_receipts",
]


def demo_records(n: int, chats: int, *, run: str = "demo") -> list[Inbound]:
    """``n`` messages spread round-robin over ``chats`` chats; ids ``<run>-<i>``, text ``msg <k>``
    where ``k`` counts the messages of that chat (so a chat's order is checkable)."""
    if n < 0 or chats < 1:
        raise ValueError(f"need n >= 0 and chats >= 1, got n={n}, chats={chats}")
    out = []
    per_chat = [0] * chats
    for i in range(n):
        c = i % chats
        per_chat[c] += 1
        out.append(
            Inbound(
                chat_id=f"{run}-chat-{c}",
                id=f"{run}-{i}",
                text=f"msg {per_chat[c]}",
                sender=f"user-{c}",
                channel="demo",
                ts=time.time(),
            )
        )
    return out


async def produce_inbound(
    bootstrap: str, topic: str, records: list[Inbound], *, linger_ms: int = 5
) -> float:
    """Produce ``records`` keyed by chat id (acks=all); returns the seconds it took."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=linger_ms)
    await producer.start()
    t0 = time.monotonic()
    try:
        futs = [
            await producer.send(topic, encode_inbound(r), key=chat_key(r.chat_id)) for r in records
        ]
        await asyncio.gather(*futs)
    finally:
        await producer.stop()
    return time.monotonic() - t0


async def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """Partition -> high watermark of ``topic``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        parts = await _partitions(consumer, topic)
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        ends = await consumer.end_offsets(tps) if tps else {}
        return {tp.partition: off for tp, off in ends.items()}
    finally:
        await consumer.stop()


async def read_journal(bootstrap: str, changelog: str, prefix: str = "") -> dict[str, Entry]:
    """The worker's journal as its changelog holds it now (the last record of each key up
    to the end offsets; deleted keys left out), keys under ``prefix`` only. Reads with
    ``read_uncommitted``: every record the broker acked."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    found: dict[str, Entry] = {}
    try:
        parts = await _partitions(consumer, changelog)
        tps = [TopicPartition(changelog, p) for p in sorted(parts)]
        ends = await consumer.end_offsets(tps) if tps else {}
        starts = await consumer.beginning_offsets(tps) if tps else {}
        todo = {tp for tp in tps if ends[tp] > starts[tp]}
        consumer.assign(tps)
        for tp in tps:  # explicit offsets: seek_to_beginning can lose to the initial reset
            consumer.seek(tp, starts[tp])
        while todo:
            batch = await consumer.getmany(*todo, timeout_ms=1000)
            for tp, msgs in batch.items():
                for m in msgs:
                    key = (m.key or b"").decode()
                    if not key.startswith(prefix):
                        continue
                    entry = decode_entry(m.key or b"", m.value)
                    if entry is None:
                        found.pop(key, None)
                    else:
                        found[key] = entry
                if await consumer.position(tp) >= ends[tp]:
                    todo.discard(tp)
    finally:
        await consumer.stop()
    return found


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    # partitions_for_topic only knows topics the consumer subscribed to: ask the cluster.
    metadata = await consumer._client.fetch_all_metadata()
    return set(metadata.partitions_for_topic(topic) or ())


@dataclass(frozen=True, slots=True)
class Seen:
    receipt: Receipt
    partition: int
    offset: int
    arrived: float  # time.monotonic() when consumed


async def tail_receipts(
    bootstrap: str,
    topic: str,
    *,
    start: dict[int, int] | None = None,
    from_beginning: bool = False,
    idle_timeout: float | None = None,
    on_bad: Callable[[bytes | None, str], None] | None = None,
) -> AsyncGenerator[Seen, None]:
    """Yield the receipts on ``topic`` (no consumer group: nothing is committed).

    ``start``: partition -> offset to begin at (e.g. from :func:`end_offsets` before producing);
    else the end (or the beginning with ``from_beginning``). ``idle_timeout``: stop after that
    many seconds without a record.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest" if from_beginning else "latest",
    )
    await consumer.start()
    try:
        parts = await _partitions(consumer, topic)
        if not parts:
            raise LookupError(f"topic {topic!r} does not exist; run `botmesh topics create`")
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        for tp in tps:
            if start is not None:
                consumer.seek(tp, start.get(tp.partition, 0))
            elif from_beginning:
                await consumer.seek_to_beginning(tp)
            else:
                await consumer.seek_to_end(tp)
        last = time.monotonic()
        while True:
            batch = await consumer.getmany(timeout_ms=200, max_records=1000)
            now = time.monotonic()
            if not batch:
                if idle_timeout is not None and now - last > idle_timeout:
                    return
                continue
            last = now
            for tp, msgs in batch.items():
                for m in msgs:
                    try:
                        rec = decode_receipt(m.value)
                    except ValueError as exc:
                        if on_bad is not None:
                            on_bad(m.value, str(exc))
                        continue
                    yield Seen(rec, tp.partition, m.offset, now)
    finally:
        await consumer.stop()
