"""End-to-end on a real broker: ``botmesh worker`` (a subprocess) running the test bot
(``tests/kafka/bot.py``) on its file journal: receipts and per-chat order, the inbound DLQ,
restart from committed offsets. Each test has its own topic prefix and data dir."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from botmesh import Inbound
from botmesh.streams.ops.tools import demo_records, end_offsets, produce_inbound
from botmesh.streams.provision import ensure_topics
from botmesh.streams.worker.loop import UNREADABLE_HEADERS
from botmesh.topics import Catalog, encode_inbound
from tests.kafka.bot import reply_text
from tests.kafka.broker import committed_offsets
from tests.kafka.record_batch import Record, produce_raw
from tests.kafka.worker import PARTITIONS, WAIT_S, Worker, collect, dead_letters
from tests.murmur2 import java_partition

pytestmark = pytest.mark.kafka

#: The partition of chat ``c1``'s records: where Java's producer and ours put key ``c1``.
C1 = java_partition(b"c1", PARTITIONS)


async def produce_each(worker: Worker, topic: str, values: list[bytes]) -> list[int]:
    """Each of ``values`` keyed ``c1`` to its partition, one acked after the other, with a
    Produce request of the test's own (``tests/kafka/record_batch.py``: no producer's size
    limit in the way); their offsets."""
    return [
        await asyncio.to_thread(produce_raw, worker.bootstrap, topic, C1, [(b"c1", value, [])])
        for value in values
    ]


@pytest.fixture
def worker(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> Iterator[Worker]:
    ensure_topics(kafka_bootstrap, Catalog(topic_prefix).specs(partitions=PARTITIONS))
    w = Worker(kafka_bootstrap, topic_prefix, tmp_path)
    yield w
    w.close()


async def test_receipts_for_1000_messages_keep_per_chat_order(worker: Worker) -> None:
    cat = Catalog(worker.prefix)
    start = await end_offsets(worker.bootstrap, cat.sent)
    records = demo_records(1000, 20, run="a")
    await produce_inbound(worker.bootstrap, cat.inbound, records)
    worker.start()
    seen = await collect(worker, cat.sent, start, {r.id for r in records})
    assert worker.stop() == 0

    assert len(seen) == 1000
    by_chat: dict[str, list[int]] = collections.defaultdict(list)
    for s in seen:
        assert s.receipt.state == "sent" and s.receipt.message_id
        assert s.receipt.key == f"{s.receipt.inbound_id}:1"
        by_chat[s.receipt.chat_id].append(int((s.receipt.inbound_id or "").split("-")[1]))
    assert len(by_chat) == 20
    for chat, seq in by_chat.items():
        assert seq == sorted(seq), f"chat {chat} out of order: {seq}"
        assert len(seq) == 50
    # one chat, one partition, on the receipts topic too
    parts = collections.defaultdict(set)
    for s in seen:
        parts[s.receipt.chat_id].add(s.partition)
    assert all(len(p) == 1 for p in parts.values())
    assert set(worker.handled().values()) == {1}
    texts = {r.id: r.text for r in records}
    assert sorted(s["text"] for s in worker.sends()) == sorted(
        reply_text(i, t) for i, t in texts.items()
    )


async def test_malformed_records_go_to_the_dlq_and_the_next_message_is_processed(
    worker: Worker,
) -> None:
    cat = Catalog(worker.prefix)
    start = await end_offsets(worker.bootstrap, cat.sent)
    good = [
        Inbound(chat_id="c1", id=f"ok-{i}", text="fail" if i == 2 else f"t{i}") for i in range(5)
    ]
    bad = [
        (b"{not json", "bad-json"),
        (b'{"v": 1, "text": "no chat"}', "missing-chat-id"),
        (b'{"v": 7, "chat_id": "c1"}', "unknown-version"),
    ]
    # good0, bad-json, good1, missing-chat-id, good2 (the handler raises), unknown-version,
    # good3, good4
    values = [
        encode_inbound(good[0]),
        bad[0][0],
        encode_inbound(good[1]),
        bad[1][0],
        encode_inbound(good[2]),
        bad[2][0],
        encode_inbound(good[3]),
        encode_inbound(good[4]),
    ]
    offsets = [(C1, offset) for offset in await produce_each(worker, cat.inbound, values)]
    worker.start()
    # every good message but the failing one sends a receipt; ok-4 is after all the bad ones
    seen = await collect(worker, cat.sent, start, {"ok-0", "ok-1", "ok-3", "ok-4"})
    assert [s.receipt.inbound_id for s in seen] == ["ok-0", "ok-1", "ok-3", "ok-4"]
    assert worker.handled() == {f"ok-{i}": 1 for i in range(5)}

    dead = await dead_letters(
        worker.bootstrap, cat.inbound_dlq, lambda d: len(d) >= 3, worker.check_alive
    )
    assert worker.stop() == 0
    assert len(dead) == 3
    dead.sort(key=lambda m: int(dict(m.headers)["source.offset"]))
    for m, (value, reason), src in zip(dead, bad, [offsets[i] for i in (1, 3, 5)], strict=True):
        h = dict(m.headers)
        assert h["reason"].decode() == reason
        assert h["detail"]
        assert h["error.class"] == b"BadRecord"
        assert h["source.topic"].decode() == cat.inbound
        assert (int(h["source.partition"]), int(h["source.offset"])) == src
        assert m.value == value and m.key == b"c1"


async def test_restart_continues_from_committed_offsets(worker: Worker) -> None:
    cat = Catalog(worker.prefix)
    start = await end_offsets(worker.bootstrap, cat.sent)
    first = demo_records(300, 10, run="r1")
    await produce_inbound(worker.bootstrap, cat.inbound, first)
    worker.start()
    await collect(worker, cat.sent, start, {r.id for r in first})
    # wait until the group committed everything (the worker commits at its checkpoints), then stop
    ends = await end_offsets(worker.bootstrap, cat.inbound)
    deadline = time.monotonic() + WAIT_S
    while True:
        worker.check_alive()
        done = committed_offsets(worker.bootstrap, cat.group)
        if all(done.get((cat.inbound, p), 0) >= end for p, end in ends.items()):
            break
        assert time.monotonic() < deadline, f"offsets not committed: {done} < {ends}"
        await asyncio.sleep(0.5)
    assert worker.stop() == 0
    after_first = worker.handled()
    assert after_first == {r.id: 1 for r in first}

    second = demo_records(300, 10, run="r2")
    await produce_inbound(worker.bootstrap, cat.inbound, second)
    worker.start()
    seen = await collect(worker, cat.sent, start, {r.id for r in first + second})
    assert worker.stop() == 0

    handled = worker.handled()
    assert {i: n for i, n in handled.items() if n != 1} == {}, "handled twice"
    assert set(handled) == {r.id for r in first + second}
    ids = [s.receipt.inbound_id for s in seen]
    twice = {i: n for i, n in collections.Counter(ids).items() if n > 1}
    assert twice == {}, f"receipts published twice: {twice} (the runs' logs: {worker.tmp})"
    assert len(ids) == 600


#: The largest value the broker takes with its default ``max.message.bytes`` (1,048,588) and
#: a two-byte key: over the worker producer's limit (1,000,000) once copied with headers.
HUGE = 1_048_500


async def test_records_too_large_to_copy_reach_the_dlq_cut_and_the_worker_goes_on(
    worker: Worker,
) -> None:
    """An undecodable inbound and an undecodable request of 1,048,500 bytes, then a valid
    inbound too large to journal, then a normal message of the same chat: each large one
    reaches its DLQ cut (headers ``truncated``, ``original.size``, the source offset), the
    next message is answered and the worker never exits (before: status 75 at every start,
    the partition stalled)."""
    cat = Catalog(worker.prefix)
    start = await end_offsets(worker.bootstrap, cat.sent)
    junk = b"{" + bytes(range(256)) * (HUGE // 256) + b"!" * (HUGE % 256 - 1)
    request = b'"' + b"r" * (HUGE - 2) + b'"'  # JSON, but a string
    valid = encode_inbound(Inbound(chat_id="c1", id="big", text="y" * (HUGE - 200)))
    assert len(junk) == len(request) == HUGE and HUGE - 200 < len(valid) <= HUGE
    after = encode_inbound(Inbound(chat_id="c1", id="after", text="still here"))
    # records of our own, with no producer's limit in the way (the broker is the judge)
    sources = {}
    for topic, value, reason in (
        (cat.inbound, junk, "bad-json"),
        (cat.requests, request, "not-object"),
        (cat.inbound, valid, "too-large"),
    ):
        [offset] = await produce_each(worker, topic, [value])
        sources[(topic, offset)] = (value, reason)
    await produce_each(worker, cat.inbound, [after])
    worker.start()
    seen = await collect(worker, cat.sent, start, {"after"})
    assert [s.receipt.inbound_id for s in seen] == ["after"]
    dead = await dead_letters(
        worker.bootstrap, cat.inbound_dlq, lambda d: len(d) >= 2, worker.check_alive
    )
    dead += await dead_letters(
        worker.bootstrap, cat.requests_dlq, lambda d: len(d) >= 1, worker.check_alive
    )
    worker.check_alive()
    assert worker.stop() == 0
    assert worker.handled() == {"after": 1}  # the valid one was never journaled nor run

    got = {}
    for m in dead:
        h = {k: v.decode(errors="replace") for k, v in m.headers}
        where = (h["source.topic"], int(h["source.offset"]))
        original, _ = sources[where]
        assert h["source.partition"] == str(C1)
        assert (h["truncated"], h["original.size"]) == ("true", str(len(original)))
        assert m.key == b"c1" and 900_000 < len(m.value) < len(original)
        assert m.value == original[: len(m.value)]
        got[where] = h["reason"]
    assert got == {where: reason for where, (_, reason) in sources.items()}


async def test_a_header_key_that_is_not_utf8_neither_stops_the_worker_nor_its_partition(
    worker: Worker,
) -> None:
    """The broker takes any bytes as a header key (a producer that is not ours can put 0xff
    there; this one is a Produce request of the test's own, ``tests/kafka/record_batch.py``).
    A valid inbound with such a header is answered, an undecodable one reaches the DLQ (with
    ``headers.unreadable`` in place of the headers: confluent-kafka cannot hand them over),
    and the next message is answered."""
    cat = Catalog(worker.prefix)
    start = await end_offsets(worker.bootstrap, cat.sent)
    odd = [(b"\xff", b"odd"), (b"trace", b"t-1")]
    good = Inbound(chat_id="c1", id="odd-header", text="hi")
    after = Inbound(chat_id="c1", id="after", text="still here")
    records: list[Record] = [
        (b"c1", encode_inbound(good), odd),
        (b"c1", b"{nope", odd),
        (b"c1", encode_inbound(after), []),
    ]
    base = await asyncio.to_thread(produce_raw, worker.bootstrap, cat.inbound, C1, records)
    bad_offset = base + 1
    worker.start()
    seen = await collect(worker, cat.sent, start, {"odd-header", "after"})
    assert [s.receipt.inbound_id for s in seen] == ["odd-header", "after"]
    [dead] = await dead_letters(
        worker.bootstrap, cat.inbound_dlq, lambda d: len(d) >= 1, worker.check_alive
    )
    worker.check_alive()
    assert worker.stop() == 0
    h = dict(dead.headers)
    assert (h["reason"], h["source.offset"]) == (b"bad-json", str(bad_offset).encode())
    # confluent-kafka cannot hand such headers over: the copy says they were dropped
    assert b"not UTF-8" in h[UNREADABLE_HEADERS] and "trace" not in h
    assert dead.value == b"{nope"
