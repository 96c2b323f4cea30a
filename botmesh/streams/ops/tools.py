"""Operator tools on confluent-kafka: demo traffic for the inbound topic, send requests (sends from
outside a handler), a tail of the receipts, and the worker's journal read back from its
changelog.

Used by ``botmesh produce``, ``botmesh send``, ``botmesh receipts``, ``botmesh/examples/demo.py``,
the tests and the benchmark. :func:`request_send` is the API of other services: it asks the
bot to send to a chat through ``<prefix>.requests``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaException, Message, TopicPartition

from botmesh.state.kv import Entry
from botmesh.state.messages import Inbound, Media, Receipt
from botmesh.streams.clients import (
    ONE_SHOT,
    AsyncProducer,
    metadata,
    partitions_of,
    read_to_end,
    reader,
    wait_topic,
    watermarks,
)
from botmesh.streams.connection import Brokers
from botmesh.streams.journal_db import JournalView
from botmesh.topics.catalog import Catalog
from botmesh.topics.records import (
    SendRequest,
    chat_key,
    decode_receipt,
    decode_request,
    encode_inbound,
    encode_request,
)

__all__ = [
    "Seen",
    "check_requests_topic",
    "demo_records",
    "end_offsets",
    "produce_inbound",
    "produce_requests",
    "read_journal",
    "request_send",
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
    bootstrap: Brokers, topic: str, records: list[Inbound], *, linger_ms: int = 5
) -> float:
    """Produce ``records`` keyed by chat id (acks=all); returns the seconds it took."""
    values = [(chat_key(r.chat_id), encode_inbound(r)) for r in records]
    return await _produce(bootstrap, topic, values, linger_ms=linger_ms)


async def produce_requests(
    bootstrap: Brokers, topic: str, requests: list[SendRequest], *, linger_ms: int = 5
) -> float:
    """Produce send ``requests`` to ``topic`` (``<prefix>.requests``) keyed by chat id
    (acks=all, in order); returns the seconds it took. No check of the topic or of the
    requests: :func:`request_send` is the checked way for one request."""
    values = [(chat_key(r.chat_id), encode_request(r)) for r in requests]
    return await _produce(bootstrap, topic, values, linger_ms=linger_ms)


async def _produce(
    bootstrap: Brokers, topic: str, values: list[tuple[bytes, bytes]], *, linger_ms: int
) -> float:
    await metadata(bootstrap)  # the first contact: ``ConnectionError`` naming the brokers
    producer = AsyncProducer(bootstrap, settings={**ONE_SHOT, "linger.ms": linger_ms})
    t0 = time.monotonic()
    try:
        futs = [await producer.send(topic, value, key=key) for key, value in values]
        await asyncio.gather(*futs)
    finally:
        await producer.close()
    return time.monotonic() - t0


async def request_send(
    bootstrap: Brokers,
    prefix: str,
    chat_id: str,
    text: str | None = None,
    *,
    key: str | None = None,
    media: Media | None = None,
    options: Mapping[str, Any] | None = None,
    request_id: str | None = None,
    at: float | None = None,
    expires_at: float | None = None,
    edit: str | None = None,
    delete: str | None = None,
) -> str:
    """Ask the bot to send ``text`` (and/or ``media``) to ``chat_id`` from outside a handler:
    one send request on ``<prefix>.requests``, keyed by the chat id, produced with acks=all.
    Returns the request id (``request_id``, else a new random one) once the broker acked it.

    The worker that owns the chat journals the send and delivers it in order with the chat's
    other sends, under the idempotency key ``key``, else ``req:<request id>``: producing the
    same request again (same ``request_id`` or same ``key``, e.g. after a timeout here) sends
    once. Its receipt comes on ``<prefix>.sent`` with that key. ``at`` (epoch seconds)
    schedules it: it goes out at that time, not before; ``expires_at`` (epoch seconds) is
    its deadline: not delivered by then, it dies ``expired`` instead of going out late.
    ``edit`` (a send's key) edits that send to ``text`` instead, ``delete`` deletes it
    (``botmesh.state.edits``), made once under ``key``.

    Raises ``BadRecord`` (a ``ValueError``) for a request the worker would refuse (neither
    text nor media, a ``#`` in the key…), ``LookupError`` when the topic does not exist
    (run ``botmesh topics create``), ``ValueError`` when it has another partition count than
    the inbound, ``ConnectionError`` when the broker cannot be reached.
    """
    cat = Catalog(prefix)
    request = SendRequest(
        id=request_id if request_id is not None else uuid.uuid4().hex,
        chat_id=chat_id,
        text=text,
        media=media,
        key=key,
        options=dict(options) if options else {},
        at=at,
        expires_at=expires_at,
        edit=edit,
        delete=delete,
    )
    value = encode_request(request)
    decode_request(value)  # the worker's checks, here: refused before it is produced
    # the first contact: ``ConnectionError`` naming the brokers, ``KafkaAuthError``
    cluster = await metadata(bootstrap)
    check_requests_topic(cluster, cat)
    producer = AsyncProducer(bootstrap, settings=ONE_SHOT)
    try:
        await producer.send_and_wait(cat.requests, value, key=chat_key(request.chat_id))
    finally:
        await producer.close()
    return request.id


def check_requests_topic(cluster: Any, cat: Catalog) -> None:
    """The requests topic exists (never created by a produce: a broker that auto-creates
    topics would give it its default partitions) with the inbound's partition count."""
    requests = partitions_of(cluster, cat.requests)
    if not requests:
        raise LookupError(
            f"topic {cat.requests!r} does not exist; run `botmesh topics create "
            f"--prefix {cat.prefix}` (or start the worker, which creates it)"
        )
    inbound = partitions_of(cluster, cat.inbound)
    if inbound and len(inbound) != len(requests):
        raise ValueError(
            f"topic {cat.requests!r} has {len(requests)} partitions but {cat.inbound!r} has "
            f"{len(inbound)}: a chat's requests would not reach the worker of its messages; "
            f"recreate {cat.requests!r} with {len(inbound)} partitions"
        )


async def end_offsets(bootstrap: Brokers, topic: str) -> dict[int, int]:
    """Partition -> high watermark of ``topic``."""
    return await asyncio.to_thread(_end_offsets, bootstrap, topic)


def _end_offsets(bootstrap: Brokers, topic: str) -> dict[int, int]:
    parts = wait_topic(bootstrap, topic)
    consumer = reader(bootstrap, "botmesh-tools")
    try:
        spans = watermarks(consumer, [(topic, p) for p in parts])
    finally:
        consumer.close()
    return {p: end for (_, p), (_, end) in spans.items()}


async def read_journal(bootstrap: Brokers, changelog: str, prefix: str = "") -> dict[str, Entry]:
    """The worker's journal as its changelog holds it now (the last record of each key up
    to the end offsets; deleted keys left out), keys under ``prefix`` only. Reads with
    ``read_uncommitted``: every record the broker acked."""
    return await asyncio.to_thread(_read_journal, bootstrap, changelog, prefix)


def _read_journal(bootstrap: Brokers, changelog: str, prefix: str) -> dict[str, Entry]:
    view = JournalView()

    def take(m: Message) -> None:
        view.apply(m.key() or b"", m.value())

    parts = wait_topic(bootstrap, changelog)
    consumer = reader(bootstrap, "botmesh-tools")
    try:
        spans = watermarks(consumer, [(changelog, p) for p in parts])
        read_to_end(consumer, spans, take)
    finally:
        consumer.close()
    return {k: e for k, e in view.entries.items() if k.startswith(prefix)}


@dataclass(frozen=True, slots=True)
class Seen:
    receipt: Receipt
    partition: int
    offset: int
    arrived: float  # time.monotonic() when consumed


def _records(batch: list[Message]) -> list[Message]:
    """The records of ``batch``, leaving out its errors; ``KafkaException`` for a fatal one."""
    records = [m for m in batch if m.error() is None]
    for m in batch:
        err = m.error()
        if err is not None and err.fatal():
            raise KafkaException(err)
    return records


def _receipt(m: Message, on_bad: Callable[[bytes | None, str], None] | None) -> Receipt | None:
    """The receipt ``m`` holds; ``None`` (told to ``on_bad``) when it holds none."""
    value = m.value()
    try:
        return decode_receipt(value)
    except ValueError as exc:
        if on_bad is not None:
            on_bad(value, str(exc))
        return None


async def tail_receipts(
    bootstrap: Brokers,
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
    parts = await asyncio.to_thread(wait_topic, bootstrap, topic)
    if not parts:
        raise LookupError(f"topic {topic!r} does not exist; run `botmesh topics create`")
    consumer = reader(
        bootstrap,
        "botmesh-receipts",
        {
            "auto.offset.reset": "earliest" if from_beginning else "latest",
            "enable.partition.eof": False,
            "fetch.wait.max.ms": 100,
        },
    )
    polling: asyncio.Future[list[Message]] | None = None
    try:
        if start is not None:
            at = [start.get(p, 0) for p in parts]
        else:
            at = [OFFSET_BEGINNING if from_beginning else OFFSET_END] * len(parts)
        consumer.assign([TopicPartition(topic, p, o) for p, o in zip(parts, at, strict=True)])
        last = time.monotonic()
        while True:
            # shielded: a cancelled tail closes the consumer only once this call returned
            polling = asyncio.ensure_future(asyncio.to_thread(consumer.consume, 1000, 0.2))
            batch = await asyncio.shield(polling)
            now = time.monotonic()
            records = _records(batch)
            if not records:
                if idle_timeout is not None and now - last > idle_timeout:
                    return
                continue
            last = now
            for m in records:
                rec = _receipt(m, on_bad)
                if rec is not None:
                    yield Seen(rec, int(m.partition() or 0), int(m.offset() or 0), now)
    finally:
        if polling is not None:
            await asyncio.wait([polling])
        await asyncio.to_thread(consumer.close)
