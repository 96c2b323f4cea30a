"""A journal restore that outlasts the session timeout, on a real broker.

The worker's membership fence refuses journal writes once its membership was last confirmed
more than half the session timeout ago (``botmesh.streams.worker.loop``), and a restore is
work the worker does in its rebalance callback before it serves the partition. A long one
once left the membership unconfirmed when the recovery pass began to write: the worker gave
its batch up and exited 75 (found by ``bench/bench_scale.py`` restoring 3,000,000 records).
What it must do instead: keep the membership confirmed (the group is asked meanwhile, and
again before the recovery pass writes), then serve.

Here the changelog holds enough finished records that the restore, on an empty data dir,
takes longer than half a 6 s session timeout, the smallest Kafka allows (here about 8 s,
longer than all of it); the test checks the worker's own figure for that first, then that
the worker answers every inbound, never says its membership went unconfirmed, and stops
cleanly.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from botmesh.state.kv import Entry
from botmesh.streams.journal_db import encode_entry
from botmesh.streams.ops.tools import demo_records, end_offsets, produce_inbound
from botmesh.streams.provision import ensure_topics
from botmesh.topics import Catalog
from tests.kafka.worker import Worker, collect, wait_line

pytestmark = pytest.mark.kafka  # not "slow": it runs after the kill tests, not beside them

SESSION_S = 6.0
#: Finished inbound records on the changelog: about 5.6 s of restore here (125,000 a second).
RECORDS = 700_000
RESTORED = re.compile(r"journal partition 0 restored: (\d+) changelog records .* in ([\d.]+) s")


def fill_changelog(bootstrap: str, topic: str, n: int) -> None:
    """``n`` finished inbounds of another bot's journal, as the journal writes them."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    purge = time.time() + 86_400.0
    for i in range(n):
        key = f"old/in/m{i}"
        value = {"state": "done", "attempts": 1, "chat": f"c{i % 5000}", "text": "earlier"}
        entry = Entry(key, value, 2, None, purge)
        producer.produce(topic, value=encode_entry(entry), key=key.encode(), partition=0)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0


async def test_a_restore_longer_than_half_the_session_timeout_then_serves(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    cat = Catalog(topic_prefix)
    ensure_topics(kafka_bootstrap, cat.specs(partitions=1))
    fill_changelog(kafka_bootstrap, cat.changelog("journal"), RECORDS)
    start = await end_offsets(kafka_bootstrap, cat.sent)
    records = demo_records(40, 8, run="r")
    await produce_inbound(kafka_bootstrap, cat.inbound, records)
    worker = Worker(
        kafka_bootstrap,
        topic_prefix,
        tmp_path,
        partitions=1,
        env={"BOTMESH_SESSION_TIMEOUT": f"{SESSION_S:g}"},
        loglevel="info",
    )
    worker.start()
    try:
        line = wait_line(worker, "journal partition 0 restored")
        found = RESTORED.search(line)
        assert found is not None, line
        restored, took = int(found[1]), float(found[2])
        print(f"\nrestore: {restored} changelog records in {took} s")
        assert restored >= RECORDS
        # what the test is about: the restore outlasted what the fence allows unconfirmed
        assert took > SESSION_S / 2, f"a restore of {took} s proves nothing: raise RECORDS"
        await collect(worker, cat.sent, start, {r.id for r in records})
        assert not any("membership not confirmed" in x for x in worker.lines())
        assert worker.stop() == 0
    finally:
        worker.close()
