"""``exactly_once`` on a real broker: the worker (``--guarantee`` via
``BOTMESH_PROCESSING_GUARANTEE=exactly_once``) on the journal on Kafka, whose changelog
records go into the worker's Kafka transaction (``botmesh.streams.worker.changelog``).

- 500 messages over 10 chats: each reply sent once, each receipt there, the journal read
  back from the changelog with ``read_committed`` matching the provider's calls;
- SIGKILL 3 times during the traffic (8 under ``make soak``), restarted with the same
  instance id: none lost, none sent twice, the journal (read_committed) matching the
  provider's calls, and each settled send's receipt once on ``<prefix>.sent`` for a
  ``read_committed`` reader;
- a restarted worker restores only the changelog's tail: the journal persists the
  changelog offsets in RocksDB after each transaction commit.
"""

from __future__ import annotations

import asyncio
import collections
import random
import re
import time
from pathlib import Path
from typing import Any

import pytest

from botmesh.journal import OutboxState
from botmesh.streams.ops.tools import (
    demo_records,
    end_offsets,
    produce_inbound,
)
from botmesh.streams.provision import ensure_topics
from botmesh.topics import Catalog
from botmesh.topics.records import decode_receipt
from tests.kafka.bot import bot, reply_text
from tests.kafka.unknowns import check_unknown_sends, file_callers
from tests.kafka.worker import (
    PARTITIONS,
    WAIT_S,
    Answers,
    Worker,
    collect,
    kill_as_answers_come,
    read_all,
    read_journal,
    stream_slices,
)
from tests.soak import rounds, seed

pytestmark = pytest.mark.kafka

EOS = {"BOTMESH_PROCESSING_GUARANTEE": "exactly_once"}
_REPLY = re.compile(r"^echo (?P<id>\S+): ")
SETTLED = {OutboxState.SENT, OutboxState.UNKNOWN}


def eos_worker(bootstrap: str, prefix: str, tmp: Path, **kw: Any) -> Worker:
    ensure_topics(bootstrap, Catalog(prefix).specs(partitions=PARTITIONS))
    return Worker(bootstrap, prefix, tmp, env=dict(EOS), **kw)


def check_journal(journal: dict[str, dict[str, Any]], ids: set[str], calls: list[Any]) -> Any:
    """Every inbound done, every send settled, each provider call one send of the journal,
    each ``sent`` send one call with its message id; (outbox, unknown keys)."""
    inbox = {v["id"]: v for k, v in journal.items() if k.startswith(f"{bot.scope}/in/")}
    outbox = {v["key"]: v for k, v in journal.items() if k.startswith(f"{bot.scope}/out/")}
    assert set(inbox) == ids, f"{len(ids - set(inbox))} inbounds lost"
    assert {v["state"] for v in inbox.values()} == {"done"}
    states = collections.Counter(v["state"] for v in outbox.values())
    assert set(states) <= SETTLED, states
    texts = collections.Counter(c["text"] for c in calls)
    assert [t for t, n in texts.items() if n > 1] == [], "a send reached the provider twice"
    for call in calls:
        m = _REPLY.match(call["text"])
        assert m is not None, call
        record = outbox.get(f"{m['id']}:1")
        assert record is not None, f"a provider call the journal does not know: {call}"
        assert record["state"] in SETTLED, record
    called = {c["message_id"] for c in calls}
    for key, v in outbox.items():
        if v["state"] == OutboxState.SENT:
            assert v["message_id"] in called, f"{key} is sent but the provider never saw it"
    assert set(outbox) == {f"{i}:1" for i in ids}
    return outbox, [k for k, v in outbox.items() if v["state"] == OutboxState.UNKNOWN]


async def test_exactly_once_worker_answers_500_messages_once(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    worker = eos_worker(kafka_bootstrap, topic_prefix, tmp_path, loglevel="info")
    cat = Catalog(topic_prefix)
    start = await end_offsets(kafka_bootstrap, cat.sent)
    records = demo_records(500, 10, run="e")
    await produce_inbound(kafka_bootstrap, cat.inbound, records)
    worker.start()
    try:
        seen = await collect(worker, cat.sent, start, {r.id for r in records})
        assert worker.stop() == 0
    finally:
        worker.close()
    assert any("exactly_once" in line or "transactional" in line for line in worker.lines())
    assert len(seen) == 500
    assert {s.receipt.state for s in seen} == {"sent"}
    calls = worker.sends()
    assert sorted(c["text"] for c in calls) == sorted(reply_text(r.id, r.text) for r in records)
    journal = await read_journal(worker)  # read_committed
    _, unknown = check_journal(journal, {r.id for r in records}, calls)
    assert unknown == []


MESSAGES = 500
CHATS = 10
KILLS = rounds(quick=3, soak=8)


@pytest.mark.crash
@pytest.mark.soak
async def test_exactly_once_worker_killed_again_and_again_loses_nothing_and_sends_nothing_twice(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    worker = eos_worker(kafka_bootstrap, topic_prefix, tmp_path)
    cat = Catalog(topic_prefix)
    records = demo_records(MESSAGES, CHATS, run="k")
    ids = {r.id for r in records}
    rng = random.Random(seed(20261202))
    start = await end_offsets(kafka_bootstrap, cat.sent)
    async with Answers(worker, cat.sent, start) as got:
        # the traffic keeps coming while the worker dies
        producing = asyncio.ensure_future(
            stream_slices(kafka_bootstrap, cat.inbound, records, 25, 0.1)
        )
        worker.start()
        try:
            await kill_as_answers_come(worker, got, ids, kills=KILLS, rng=rng, jitter=0.3)
            await producing
            await got.until(ids, MESSAGES)
            assert worker.stop() == 0
        finally:
            producing.cancel()
            worker.close()
    seen = got.seen

    calls = worker.sends()
    journal = await read_journal(worker)  # the changelog, read_committed
    outbox, _ = check_journal(journal, ids, calls)
    left = check_unknown_sends(outbox, file_callers(calls), worker.killed, chats=CHATS)
    receipts = collections.defaultdict(set)
    for s in seen:
        receipts[s.receipt.key].add(s.receipt.state)
    missing = [k for k, v in outbox.items() if v["state"] not in receipts.get(k, ())]
    assert missing == [], f"{len(missing)} settled sends without their receipt"
    sent = sum(1 for v in outbox.values() if v["state"] == OutboxState.SENT)
    # every receipt the topic holds, the worker stopped: each settled send's once (it
    # commits with the journal record that settles the send; a replay answered from the
    # outbox publishes nothing again)
    committed = [
        decode_receipt(r.value) for r in await read_all(kafka_bootstrap, cat.sent, committed=True)
    ]
    again = collections.Counter(r.key for r in committed)
    print(
        f"\nEOS, {KILLS} kills: {len(calls)} provider calls for {MESSAGES} messages "
        f"({sent} sent, {left}, 0 twice, 0 lost), {len(committed)} receipts for "
        f"{len(again)} keys (read_committed), handler runs {sum(worker.handled().values())}"
    )
    twice = {k: n for k, n in again.items() if n > 1}
    assert twice == {}, f"{len(twice)} receipts a read_committed reader saw again: {twice}"


async def settled_changelog(bootstrap: str, topic: str) -> None:
    """Wait until ``topic`` holds no open transaction (its last stable offset is its end)
    and its end did not move over five reads in a row: the worker's last writes (the
    receipts recorded published) are committed."""
    from confluent_kafka import IsolationLevel

    from botmesh.streams.worker.restore import high_watermarks as ends_of

    parts = range(PARTITIONS)
    deadline = time.monotonic() + WAIT_S
    before: dict[int, int] = {}
    same = 0
    while True:
        ends = await asyncio.to_thread(ends_of, bootstrap, topic, parts)
        stable = await asyncio.to_thread(
            ends_of, bootstrap, topic, parts, isolation=IsolationLevel.READ_COMMITTED
        )
        same = same + 1 if ends == stable == before else 0
        if same >= 4:
            return
        assert time.monotonic() < deadline, f"the changelog kept moving: {ends} {stable}"
        before = ends if ends == stable else {}
        await asyncio.sleep(0.2)


#: The worker's line for each journal partition it restored (``botmesh.streams.worker.loop``).
RESTORED = re.compile(
    r"journal partition (\d+) restored: \d+ changelog records read from offset (-?\d+) to (-?\d+)"
)


def _restored(lines: list[str]) -> dict[int, tuple[int, int]]:
    """Partition -> (first offset read, end) of each journal partition restored, the last
    line of each."""
    found: dict[int, tuple[int, int]] = {}
    for line in lines:
        m = RESTORED.search(line)
        if m:
            found[int(m[1])] = (int(m[2]), int(m[3]))
    return found


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
async def test_a_restarted_worker_restores_only_the_changelog_tail(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, guarantee: str
) -> None:
    """Under both guarantees the journal records in RocksDB the offset of what it wrote
    there (under at_least_once in one batch per partition and turn of the loop, with the
    records acked in it), so a worker restarted after a SIGKILL reads only the tail."""
    env = dict(EOS) if guarantee == "exactly_once" else {}
    ensure_topics(kafka_bootstrap, Catalog(topic_prefix).specs(partitions=PARTITIONS))
    worker = Worker(kafka_bootstrap, topic_prefix, tmp_path, env=env, loglevel="info")
    cat = Catalog(topic_prefix)
    topic = cat.changelog("journal")
    start = await end_offsets(kafka_bootstrap, cat.sent)
    records = demo_records(300, 8, run="t")
    await produce_inbound(kafka_bootstrap, cat.inbound, records)
    worker.start()
    try:
        await collect(worker, cat.sent, start, {r.id for r in records})
        # the receipts marked published and, under exactly_once, their transaction
        # committed: the changelog's committed end stops moving (asked, not slept)
        await settled_changelog(kafka_bootstrap, topic)
        worker.kill()  # SIGKILL: nothing flushed at a stop
        ends = await end_offsets(kafka_bootstrap, topic)
        worker.start()
        deadline = time.monotonic() + WAIT_S
        while len(_restored(worker.lines())) < PARTITIONS:
            worker.check_alive()
            assert time.monotonic() < deadline, "the restarted worker restored no journal"
            await asyncio.sleep(0.1)
        lines = worker.lines()
        assert worker.stop() == 0
    finally:
        worker.close()
    restored = _restored(lines)
    assert set(restored) == set(range(PARTITIONS)), "\n".join(lines[-80:])
    total = sum(ends.values())
    replayed = sum(max(last - first, 0) for first, last in restored.values())
    print(f"\nrestart after SIGKILL: {replayed} changelog offsets replayed of {total}")
    assert total > 600  # the journal wrote hundreds of records per partition
    for p, (first, last) in restored.items():  # only the tail: the last transaction's + markers
        assert last - first <= 10, (p, first, last)
