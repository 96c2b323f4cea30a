"""SIGKILL of a real worker while it handles a stream, on a real broker; then the receipts
topic is checked against the worker's journal.

The worker (the test bot) runs on its default journal (the journal on Kafka: a RocksDB table
changelogged to ``<prefix>.worker-journal-changelog``) or, in the second variant, on an
explicit ``--journal file://...`` (append log), still a journal the worker accepts for one
worker alone. It is killed with SIGKILL several times while messages keep arriving (one in
15 is refused for good by the provider, so its send ends ``dead``), restarted each time,
left to finish and stopped cleanly. Then, with the worker gone, the test reads its journal
back (``tests.kafka.worker.read_journal``: the changelog topic decoded with
``botmesh.streams.table_kv.decode_entry``, or the file journal), ``<prefix>.sent`` and the
provider's file:

- every settled send of the journal (``sent``, ``dead``, ``unknown``) has at least one
  receipt with its key and its state, and every receipt names a send of the journal;
- no send reached the provider twice (``on_ambiguous="skip"``: at most once), every
  provider call is a send the journal knows, and every ``sent`` send was one provider call
  whose message id the journal recorded;
- every inbound is done in the journal (or dead and in the inbound DLQ), and nothing is left
  pending.
"""

from __future__ import annotations

import asyncio
import collections
import random
import re
import time
from pathlib import Path

import msgspec
import pytest

from botmesh.journal import OutboxState
from botmesh.streams.ops.tools import demo_records, end_offsets, produce_inbound
from botmesh.streams.provision import ensure_topics
from botmesh.topics import Catalog, decode_inbound, decode_receipt
from tests.kafka.bot import bot
from tests.kafka.unknowns import check_unknown_sends, file_callers
from tests.kafka.worker import (
    PARTITIONS,
    WAIT_S,
    Answers,
    Worker,
    journal_source,
    kill_as_answers_come,
    read_all,
    read_journal,
    stream_slices,
)
from tests.soak import rounds, seed

pytestmark = [pytest.mark.kafka, pytest.mark.crash, pytest.mark.soak]


async def dead_lettered(bootstrap: str, topic: str) -> set[str]:
    """The inbound ids on the inbound DLQ."""
    return {decode_inbound(m.value).id for m in await read_all(bootstrap, topic)}


MESSAGES = 1500
CHATS = 30
KILLS = rounds(quick=3, soak=8)
SETTLED = {OutboxState.SENT, OutboxState.DEAD, OutboxState.UNKNOWN}
_REPLY = re.compile(r"^echo (?P<id>\S+): ")


@pytest.mark.parametrize(
    "journal",
    ["default", "file"],
)
async def test_sigkill_during_a_stream_loses_no_receipt_and_sends_nothing_twice(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, journal: str
) -> None:
    cat = Catalog(topic_prefix)
    ensure_topics(kafka_bootstrap, cat.specs(partitions=PARTITIONS))
    url = None if journal == "default" else f"file://{tmp_path}/journal?append_log=true"
    worker = Worker(kafka_bootstrap, topic_prefix, tmp_path, journal=url)
    records = [
        msgspec.structs.replace(r, text="refuse") if i % 15 == 7 else r
        for i, r in enumerate(demo_records(MESSAGES, CHATS, run="k"))
    ]
    ids = {r.id for r in records}
    rng = random.Random(seed(20260207))

    start = await end_offsets(kafka_bootstrap, cat.sent)
    async with Answers(worker, cat.sent, start) as got:
        # the traffic keeps coming while the worker dies; the last record is for the last run
        producing = asyncio.ensure_future(
            stream_slices(kafka_bootstrap, cat.inbound, records[:-1], 100, 0.05)
        )
        worker.start()
        try:
            await kill_as_answers_come(worker, got, ids, kills=KILLS, rng=rng, jitter=0.3)
            await producing
            # the last run answers a message of its own: it has recovered its partitions (and
            # republished what the killed runs left unpublished), so its stop is a clean one
            await produce_inbound(kafka_bootstrap, cat.inbound, records[-1:])
            await got.until({records[-1].id}, 1)
            # the end: every inbound answered (sent or unknown), or dead-lettered
            deadline = time.monotonic() + WAIT_S
            while ids - got.answered - await dead_lettered(kafka_bootstrap, cat.inbound_dlq):
                got.check()
                unanswered = sorted(ids - got.answered)[:5]
                assert time.monotonic() < deadline, f"unanswered: {unanswered}"
                await asyncio.sleep(0.5)
            assert worker.stop() == 0
        finally:
            producing.cancel()
            worker.close()

    # -- the evidence, read after the worker exited ----------------------------------------
    receipts = [decode_receipt(m.value) for m in await read_all(kafka_bootstrap, cat.sent)]
    dlq = await read_all(kafka_bootstrap, cat.inbound_dlq)
    entries = await read_journal(worker)
    inbox = {v["id"]: v for k, v in entries.items() if k.startswith(f"{bot.scope}/in/")}
    outbox = {v["key"]: v for k, v in entries.items() if k.startswith(f"{bot.scope}/out/")}
    calls = worker.sends()

    # every inbound done, or dead in the journal and in the DLQ; nothing left pending
    states = collections.Counter(v["state"] for v in inbox.values())
    assert set(inbox) == ids
    assert set(states) <= {"done", "dead"}, states
    dead_ids = {i for i, v in inbox.items() if v["state"] == "dead"}
    assert dead_ids <= {decode_inbound(m.value).id for m in dlq}
    assert {v["state"] for v in outbox.values()} <= SETTLED, collections.Counter(
        v["state"] for v in outbox.values()
    )

    # every settled send has a receipt with its key and its state; no receipt from nowhere
    by_key: dict[str, set[str]] = collections.defaultdict(set)
    for r in receipts:
        by_key[r.key].add(r.state)
    missing = [
        (key, v["state"]) for key, v in outbox.items() if v["state"] not in by_key.get(key, ())
    ]
    assert missing == [], f"{len(missing)} settled sends without their receipt: {missing[:5]}"
    assert set(by_key) <= set(outbox)
    # a clean stop records the last receipts published (botmesh.streams.worker.loop)
    unpublished = [k for k, v in outbox.items() if v.get("published") is False]
    assert unpublished == [], (
        f"{len(unpublished)} settled sends still unpublished in the journal after a clean "
        f"stop, e.g. {unpublished[:5]}"
    )

    # the provider: each send at most once, each call a send the journal knows
    texts = collections.Counter(c["text"] for c in calls)
    assert [t for t, n in texts.items() if n > 1] == [], "a send reached the provider twice"
    for call in calls:
        match = _REPLY.match(call["text"])
        assert match is not None, call
        record = outbox.get(f"{match['id']}:1")
        assert record is not None, f"a provider call the journal does not know: {call}"
        assert record["state"] in (OutboxState.SENT, OutboxState.UNKNOWN), record
    called = {c["message_id"] for c in calls}
    for key, v in outbox.items():
        if v["state"] == OutboxState.SENT:
            assert v["message_id"] in called, f"{key} is sent but the provider never saw it"
    unknown = [k for k, v in outbox.items() if v["state"] == OutboxState.UNKNOWN]
    left = check_unknown_sends(outbox, file_callers(calls), worker.killed, chats=CHATS)
    dead = [k for k, v in outbox.items() if v["state"] == OutboxState.DEAD]
    refused = {f"{r.id}:1" for r in records if r.text == "refuse"}
    assert set(dead) <= refused and len(dead) >= len(refused) - len(unknown)
    print(
        f"\n{KILLS} kills, journal read from the {journal_source(worker)}: "
        f"{len(calls)} provider calls, {len(outbox)} sends "
        f"({left}, {len(dead)} dead), {len(receipts)} receipts for "
        f"{len(by_key)} keys, "
        f"inbox {dict(states)}, {len(dlq)} dead letters"
    )
