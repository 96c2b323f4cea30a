"""A journal that really fails, in the worker process, on a real broker.

The worker runs the real engine on a real ``file://`` journal in snapshot mode (every
commit writes ``<folder>/journal.tmp`` and renames it over the snapshot). The test takes
the journal's folder away while the worker runs: it renames the folder and puts a regular
file in its place, so the next commit fails with ENOTDIR (``JournalWriteError``, a
``JournalUnavailableError``), as a lost mount would. chmod would not do: the tests run as
root. Putting the folder back ends the outage; the journal's open file handles and its
lock never notice.

(i) records produced during the outage are neither acked nor handled, and are handled
exactly once after the journal is back; (ii) with the journal kept down past the bot's
inbox budget they land in the inbound DLQ with reason ``journal-unavailable`` and the error
in the headers, and the worker goes on.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from botmesh import Inbound
from botmesh.streams.clients import AsyncProducer
from botmesh.streams.ops.tools import end_offsets
from botmesh.streams.provision import ensure_topics
from botmesh.topics import Catalog, chat_key, encode_inbound
from tests.kafka.bot import reply_text
from tests.kafka.broker import committed_offsets
from tests.kafka.worker import PARTITIONS, WAIT_S, Worker, collect, dead_letters, wait_line

pytestmark = pytest.mark.kafka


class Outage:
    """The journal's folder taken away (a regular file in its place) and put back."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.away = folder.with_name(folder.name + ".away")

    def begin(self) -> None:
        os.rename(self.folder, self.away)
        self.folder.write_text("not a folder: the journal is down (test)\n")

    def end(self) -> None:
        self.folder.unlink()
        os.rename(self.away, self.folder)


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Outage]:
    folder = tmp_path / "journal"
    folder.mkdir()
    outage = Outage(folder)
    yield outage
    if outage.away.exists():
        outage.end()


def make_worker(bootstrap: str, prefix: str, tmp: Path, journal: Outage, attempts: int) -> Worker:
    ensure_topics(bootstrap, Catalog(prefix).specs(partitions=PARTITIONS))
    env = {"BOTMESH_TEST_INBOX_ATTEMPTS": str(attempts), "BOTMESH_TEST_INBOX_BACKOFF_MS": "100"}
    url = f"file://{journal.folder}/journal"  # snapshot mode: each commit creates a file
    return Worker(bootstrap, prefix, tmp, journal=url, env=env)


async def produce(
    bootstrap: str, topic: str, messages: list[Inbound]
) -> dict[str, tuple[int, int]]:
    """Produce one by one (acks=all); inbound id -> (partition, offset)."""
    producer = AsyncProducer(bootstrap)
    try:
        where = {}
        for m in messages:
            md = await producer.send_and_wait(topic, encode_inbound(m), key=chat_key(m.chat_id))
            where[m.id] = (md.partition, md.offset)
        return where
    finally:
        await producer.close()


async def warm_up(worker: Worker, cat: Catalog) -> None:
    """One message through the worker, and its offset committed: it is up and commits."""
    start = await end_offsets(worker.bootstrap, cat.sent)
    [(part, offset)] = (
        await produce(worker.bootstrap, cat.inbound, [Inbound(id="warm", chat_id="w", text="hi")])
    ).values()
    await collect(worker, cat.sent, start, {"warm"})
    deadline = time.monotonic() + WAIT_S
    while committed_offsets(worker.bootstrap, cat.group).get((cat.inbound, part), 0) <= offset:
        worker.check_alive()
        assert time.monotonic() < deadline, "the warm-up record was never committed"
        await asyncio.sleep(0.2)


async def test_records_during_a_journal_outage_wait_and_are_handled_once_it_is_back(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, journal: Outage
) -> None:
    worker = make_worker(kafka_bootstrap, topic_prefix, tmp_path, journal, attempts=100_000)
    cat = Catalog(topic_prefix)
    worker.start()
    try:
        await warm_up(worker, cat)
        start = await end_offsets(kafka_bootstrap, cat.sent)

        journal.begin()
        outage = [
            Inbound(id="o-1", chat_id="a", text="one"),
            Inbound(id="o-2", chat_id="a", text="two"),
            Inbound(id="o-3", chat_id="b", text="three"),
        ]
        where = await produce(kafka_bootstrap, cat.inbound, outage)
        # the worker tried o-1, the journal refused it, and it is being retried
        line = wait_line(worker, "inbound o-1 at ")
        assert "JournalWriteError" in line and "Not a directory" in line
        wait_line(worker, "inbound o-1 at ", "failed (attempt 3)")
        # not acked (nothing committed past any of them), not handled, nothing sent
        committed = committed_offsets(kafka_bootstrap, cat.group)
        for mid, (part, offset) in where.items():
            assert committed.get((cat.inbound, part), 0) <= offset, mid
        assert set(worker.handled()) == {"warm"}
        assert [s["text"] for s in worker.sends()] == [reply_text("warm", "hi")]
        # a chat's later record waits behind the one that fails
        assert not [line for line in worker.lines() if "inbound o-2 at " in line]

        journal.end()
        seen = await collect(worker, cat.sent, start, {"o-1", "o-2", "o-3"})
        assert worker.stop() == 0
    finally:
        worker.close()

    assert worker.handled() == {"warm": 1, "o-1": 1, "o-2": 1, "o-3": 1}
    texts = [s["text"] for s in worker.sends()]
    want = [reply_text("warm", "hi"), *(reply_text(m.id, m.text) for m in outage)]
    assert sorted(texts) == sorted(want)
    assert texts.index(reply_text("o-1", "one")) < texts.index(reply_text("o-2", "two"))
    assert {s.receipt.inbound_id for s in seen} >= {"o-1", "o-2", "o-3"}
    assert all(s.receipt.state == "sent" for s in seen)


async def test_a_journal_down_past_the_inbox_budget_dead_letters_and_the_worker_goes_on(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, journal: Outage
) -> None:
    worker = make_worker(kafka_bootstrap, topic_prefix, tmp_path, journal, attempts=3)
    cat = Catalog(topic_prefix)
    worker.start()
    try:
        await warm_up(worker, cat)

        journal.begin()
        down = [
            Inbound(id="d-1", chat_id="a", text="one"),
            Inbound(id="d-2", chat_id="a", text="two"),
        ]
        where = await produce(kafka_bootstrap, cat.inbound, down)
        offsets = {(cat.inbound, p, o): mid for mid, (p, o) in where.items()}

        def ours(records: list[object]) -> set[str]:
            found = set()
            for m in records:
                h = {k: v.decode() for k, v in getattr(m, "headers", [])}
                key = (h["source.topic"], int(h["source.partition"]), int(h["source.offset"]))
                if key in offsets:
                    found.add(offsets[key])
            return found

        dead = await dead_letters(
            kafka_bootstrap,
            cat.inbound_dlq,
            lambda d: ours(d) == {"d-1", "d-2"},
            worker.check_alive,
        )
        assert set(worker.handled()) == {"warm"}

        journal.end()
        start = await end_offsets(kafka_bootstrap, cat.sent)
        await produce(kafka_bootstrap, cat.inbound, [Inbound(id="after", chat_id="a", text="x")])
        await collect(worker, cat.sent, start, {"after"})
        assert worker.stop() == 0
    finally:
        worker.close()

    assert len(dead) == 2
    for m, msg in zip(dead, down, strict=True):
        h = {k: v.decode() for k, v in m.headers}
        assert h["reason"] == "journal-unavailable"
        assert h["error.class"] == "JournalWriteError"
        assert "Not a directory" in h["error.message"] and "ENOTDIR" in h["error.message"]
        assert h["attempts"] == "3"
        assert "JournalWriteError" in h["detail"]
        assert (int(h["source.partition"]), int(h["source.offset"])) == where[msg.id]
        assert m.value == encode_inbound(msg) and m.key == b"a"
    assert worker.handled() == {"warm": 1, "after": 1}
    assert [s["text"] for s in worker.sends()] == [
        reply_text("warm", "hi"),
        reply_text("after", "x"),
    ]


async def test_a_stop_while_a_record_waits_for_the_journal_acks_nothing_and_the_next_run_handles_it(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, journal: Outage
) -> None:
    worker = make_worker(kafka_bootstrap, topic_prefix, tmp_path, journal, attempts=100_000)
    cat = Catalog(topic_prefix)
    worker.start()
    try:
        await warm_up(worker, cat)
        start = await end_offsets(kafka_bootstrap, cat.sent)
        journal.begin()
        await produce(kafka_bootstrap, cat.inbound, [Inbound(id="s-1", chat_id="a", text="x")])
        wait_line(worker, "inbound s-1 at ", "failed (attempt 2)")
        # SIGTERM: the batch cannot be settled, so the worker leaves without acking it
        assert worker.stop() == 75
        assert [line for line in worker.lines() if "exiting without acking" in line]
        journal.end()
        worker.start()
        await collect(worker, cat.sent, start, {"s-1"})
        assert worker.stop() == 0
    finally:
        worker.close()
    assert worker.handled() == {"warm": 1, "s-1": 1}
