"""End-to-end on a real broker: the Faust worker (``botmesh worker``, a subprocess) running
``examples/recording_bot.py``: receipts and per-chat order, the inbound DLQ, restart from
committed offsets. Each test has its own topic prefix and worker data dir."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streams.provision import ensure_topics
from streams.tools import Seen, demo_records, end_offsets, produce_inbound, tail_receipts
from tests.kafka.broker import committed_offsets
from topics import Catalog, InboundRecord, encode_inbound

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 4
WAIT_S = 120.0  # hang guard only: every wait ends as soon as its condition holds


class Worker:
    """``botmesh worker --app examples.recording_bot:bot`` as a subprocess."""

    def __init__(self, bootstrap: str, prefix: str, tmp: Path) -> None:
        self.bootstrap, self.prefix, self.tmp = bootstrap, prefix, tmp
        self.record_file = tmp / "handled.txt"
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0

    def start(self) -> None:
        self.runs += 1
        self.log = self.tmp / f"worker{self.runs}.log"
        env = dict(os.environ, BOTMESH_RECORD_FILE=str(self.record_file), PYTHONUNBUFFERED="1")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "botmesh",
                    "worker",
                    "--app",
                    "examples.recording_bot:bot",
                    "--bootstrap",
                    self.bootstrap,
                    "--prefix",
                    self.prefix,
                    "--data-dir",
                    str(self.tmp / "data"),
                    "--partitions",
                    str(PARTITIONS),
                    "--loglevel",
                    "warning",
                ],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            pytest.fail(
                f"worker exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}"
            )

    def stop(self) -> int:
        """SIGTERM (a clean stop: the batch finishes, offsets are committed); the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                pytest.fail(f"worker ignored SIGTERM for 60 s:\n{self.log.read_text()[-3000:]}")
        return self.proc.returncode

    def handled(self) -> collections.Counter[str]:
        if not self.record_file.exists():
            return collections.Counter()
        return collections.Counter(self.record_file.read_text().split())


@pytest.fixture
def worker(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    ensure_topics(kafka_bootstrap, Catalog(topic_prefix).specs(partitions=PARTITIONS))
    w = Worker(kafka_bootstrap, topic_prefix, tmp_path)
    yield w
    if w.proc is not None and w.proc.poll() is None:
        w.stop()


async def collect(worker: Worker, topic: str, start: dict[int, int], want: set[str]) -> list[Seen]:
    """Receipts on ``topic`` from ``start`` until every inbound id in ``want`` has one."""
    seen: list[Seen] = []
    missing = set(want)
    receipts = tail_receipts(worker.bootstrap, topic, start=start)
    deadline = time.monotonic() + WAIT_S
    try:
        while missing:
            task = asyncio.ensure_future(anext(receipts))
            while not task.done():
                worker.check_alive()
                if time.monotonic() > deadline:
                    task.cancel()
                    pytest.fail(f"{len(missing)} receipts missing, e.g. {sorted(missing)[:5]}")
                await asyncio.wait({task}, timeout=0.5)
            s = task.result()
            seen.append(s)
            missing.discard(s.receipt.inbound_id or "")
    finally:
        await receipts.aclose()
    return seen


async def test_receipts_for_1000_messages_keep_per_chat_order(worker: Worker) -> None:
    cat = Catalog(worker.prefix)
    start = await end_offsets(worker.bootstrap, cat.sent)
    records = demo_records(1000, 20, run="a")
    await produce_inbound(worker.bootstrap, cat.inbound, records)
    worker.start()
    seen = await collect(worker, cat.sent, start, {r.id or "" for r in records})
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


async def test_malformed_records_go_to_the_dlq_and_the_next_message_is_processed(
    worker: Worker,
) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    cat = Catalog(worker.prefix)
    start = await end_offsets(worker.bootstrap, cat.sent)
    good = [
        InboundRecord(chat_id="c1", id=f"ok-{i}", text="fail" if i == 2 else f"t{i}")
        for i in range(5)
    ]
    down = InboundRecord(chat_id="c1", id="down-1", text="journal-down")
    bad = [
        (b"{not json", "bad-json"),
        (b'{"v": 1, "text": "no chat"}', "missing-chat-id"),
        (b'{"v": 7, "chat_id": "c1"}', "unknown-version"),
        (encode_inbound(down), "handle-failed"),
    ]
    # good0, bad-json, good1, missing-chat-id, good2 (handler raises), unknown-version,
    # good3, journal-down (bot.handle raises), good4
    values = [
        encode_inbound(good[0]),
        bad[0][0],
        encode_inbound(good[1]),
        bad[1][0],
        encode_inbound(good[2]),
        bad[2][0],
        encode_inbound(good[3]),
        bad[3][0],
        encode_inbound(good[4]),
    ]
    producer = AIOKafkaProducer(bootstrap_servers=worker.bootstrap, acks="all")
    await producer.start()
    try:
        offsets = []
        for v in values:
            md = await producer.send_and_wait(cat.inbound, v, key=b"c1")
            offsets.append((md.partition, md.offset))
    finally:
        await producer.stop()
    worker.start()
    # every good message but the failing one sends a receipt; ok-4 is after all the bad ones
    seen = await collect(worker, cat.sent, start, {"ok-0", "ok-1", "ok-3", "ok-4"})
    assert [s.receipt.inbound_id for s in seen] == ["ok-0", "ok-1", "ok-3", "ok-4"]
    assert worker.handled() == {f"ok-{i}": 1 for i in range(5)}

    consumer = AIOKafkaConsumer(
        cat.inbound_dlq, bootstrap_servers=worker.bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        dead = []
        deadline = time.monotonic() + WAIT_S
        while len(dead) < 4 and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            dead += [m for msgs in batch.values() for m in msgs]
    finally:
        await consumer.stop()
    assert worker.stop() == 0
    assert len(dead) == 4
    dead.sort(key=lambda m: int(dict(m.headers)["source.offset"]))
    for m, (value, reason), src in zip(dead, bad, [offsets[i] for i in (1, 3, 5, 7)], strict=True):
        h = dict(m.headers)
        assert h["reason"].decode() == reason
        assert h["detail"]
        if reason == "handle-failed":
            assert b"ConnectionError: journal unavailable" in h["detail"]
        assert h["source.topic"].decode() == cat.inbound
        assert (int(h["source.partition"]), int(h["source.offset"])) == src
        assert m.value == value and m.key == b"c1"


async def test_restart_continues_from_committed_offsets(worker: Worker) -> None:
    cat = Catalog(worker.prefix)
    start = await end_offsets(worker.bootstrap, cat.sent)
    first = demo_records(300, 10, run="r1")
    await produce_inbound(worker.bootstrap, cat.inbound, first)
    worker.start()
    await collect(worker, cat.sent, start, {r.id or "" for r in first})
    # wait until the group committed everything (Faust commits every 2.8 s), then stop
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
    seen = await collect(worker, cat.sent, start, {r.id or "" for r in first + second})
    assert worker.stop() == 0

    handled = worker.handled()
    assert {i: n for i, n in handled.items() if n != 1} == {}, "handled twice"
    assert set(handled) == {r.id for r in first + second}
    ids = [s.receipt.inbound_id for s in seen]
    assert len(ids) == len(set(ids)) == 600
