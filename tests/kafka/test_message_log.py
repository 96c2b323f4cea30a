"""The message log on Kafka: a real worker (``tests/kafka/bot.py`` on its default journal,
the RocksDB table changelogged to ``<prefix>.worker-journal-changelog``) killed with SIGKILL
while messages keep arriving, restarted, left to finish and stopped cleanly. Then, with the
worker gone, the changelog is read back (``tests.kafka.worker.read_journal``) and:

- every send the journal holds ``sent`` has exactly one log entry under
  ``<scope>/log/<chat>/``, carrying the message id the journal recorded (one the provider
  gave, per its own file of calls), and no entry names a send not recorded ``sent``;
- the console's index, fed the changelog's records, shows each chat's log.

The log entry rides in the changelog record batch of the ``sent`` mark (one journal commit,
one partition), so a kill between the provider call and that commit leaves neither.
"""

from __future__ import annotations

import asyncio
import collections
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest

from botmesh.console.index import Index
from botmesh.journal import OutboxState
from botmesh.state.keys import ScopeKeys
from botmesh.state.message_log import LoggedMessage
from botmesh.streams.ops.tail import Record
from botmesh.streams.ops.tools import demo_records, end_offsets, produce_inbound
from botmesh.streams.provision import ensure_topics
from botmesh.streams.table_kv import TABLE_NAME
from botmesh.topics import Catalog
from tests.kafka.bot import bot
from tests.kafka.unknowns import check_unknown_sends, file_callers
from tests.kafka.worker import (
    PARTITIONS,
    Answers,
    Worker,
    kill_as_answers_come,
    read_all,
    read_journal,
    stream_slices,
)
from tests.soak import seed

pytestmark = [pytest.mark.kafka, pytest.mark.crash]

MESSAGES = 400
CHATS = 12
KILLS = 2


async def test_sigkill_mid_stream_logs_each_sent_message_exactly_once(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    cat = Catalog(topic_prefix)
    ensure_topics(kafka_bootstrap, cat.specs(partitions=PARTITIONS))
    worker = Worker(kafka_bootstrap, topic_prefix, tmp_path)
    records = list(demo_records(MESSAGES, CHATS, run="log"))
    ids = {r.id for r in records}
    rng = random.Random(seed(20261205))
    start = await end_offsets(kafka_bootstrap, cat.sent)
    async with Answers(worker, cat.sent, start) as got:
        # the traffic keeps coming while the worker dies; the last record is for the last run
        producing = asyncio.ensure_future(
            stream_slices(kafka_bootstrap, cat.inbound, records[:-1], 50, 0.05)
        )
        worker.start()
        try:
            await kill_as_answers_come(worker, got, ids, kills=KILLS, rng=rng, jitter=0.2)
            await producing
            await produce_inbound(kafka_bootstrap, cat.inbound, records[-1:])
            await got.until(ids, MESSAGES)  # every inbound answered (sent, or unknown)
            assert worker.stop() == 0
        finally:
            producing.cancel()
            worker.close()

    # -- the evidence, read after the worker exited ------------------------------------------
    entries = await read_journal(worker)
    keys = ScopeKeys.of(bot.scope)
    outbox = {v["key"]: v for k, v in entries.items() if k.startswith(keys.outbox)}
    logged = [
        (k, msgspec.convert(v, LoggedMessage)) for k, v in entries.items() if k.startswith(keys.log)
    ]
    sent = {k: v for k, v in outbox.items() if v["state"] == OutboxState.SENT}
    by_key = collections.Counter(m.key for _, m in logged)
    assert [k for k, n in by_key.items() if n > 1] == [], "a send logged twice"
    assert set(by_key) == set(sent), sorted(set(by_key) ^ set(sent))[:5]
    called = {c["message_id"] for c in worker.sends()}
    for key, m in logged:
        assert key.startswith(keys.log_of(m.chat_id))
        assert m.message_id == sent[m.key]["message_id"] and m.message_id in called, m
        assert m.text == sent[m.key]["payload"]["text"] and m.channel is not None
    states = collections.Counter(v["state"] for v in outbox.values())
    assert len(sent) >= MESSAGES // 2, states  # the run did its work (a kill leaves some unknown)
    left = check_unknown_sends(outbox, file_callers(worker.sends()), worker.killed, chats=CHATS)

    # -- the console's index of the changelog shows each chat's log ---------------------------
    index = Index(cat)
    changelog = cat.changelog(TABLE_NAME)
    raw = await read_all(kafka_bootstrap, changelog, committed=True)
    index.apply(
        Record(changelog, m.partition, m.offset, m.timestamp / 1000, m.key, m.value) for m in raw
    )
    per_chat: dict[str, list[Any]] = collections.defaultdict(list)
    for _, m in logged:
        per_chat[m.chat_id].append(m)
    assert len(per_chat) == CHATS
    for chat, mine in per_chat.items():
        shown = index.timeline(chat).messages
        assert sorted(m.key for m in shown) == sorted(m.key for m in mine)
        assert [m.sent_at for m in shown] == sorted(m.sent_at for m in mine)
    print(
        f"\n{KILLS} kills: {len(outbox)} sends ({dict(states)}; {left}), {len(logged)} logged, "
        f"{len(worker.sends())} provider calls"
    )
