"""A worker's place in its group, on a real broker (``botmesh.streams.membership``): it joins only
once the broker lists its topics, it never sits on an empty assignment that no member
covers (a static member restarted with one gets partitions), and a fresh prefix answers
its first message on every start.

The race of a group leader assigning from metadata that lacks a topic is made certain by
``tests/kafka/late_topics_bot.py``: the worker creates no topics, so it subscribes before
the test creates them.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from botmesh.streams.ops.tools import demo_records, end_offsets, produce_inbound
from botmesh.streams.provision import ensure_topics, existing_topics
from botmesh.topics import Catalog
from tests.kafka.broker import forget_prefix
from tests.kafka.worker import PARTITIONS, WAIT_S, Worker, collect, wait_line
from tests.soak import rounds

pytestmark = pytest.mark.kafka

LATE = "tests.kafka.late_topics_bot:bot"
#: The line of a worker whose join waits for the broker to list its topics.
WAITING = "waiting for the broker's metadata to list"


@pytest.fixture
def worker(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> Iterator[Worker]:
    w = Worker(kafka_bootstrap, topic_prefix, tmp_path, app=LATE, loglevel="info")
    yield w
    w.close()


async def answer_one(worker: Worker, run: str) -> float:
    """Produce one message (its topics exist) and wait for its receipt; the seconds it took."""
    cat = Catalog(worker.prefix)
    start = await end_offsets(worker.bootstrap, cat.sent)
    records = demo_records(1, 1, run=run)
    t0 = time.monotonic()
    await produce_inbound(worker.bootstrap, cat.inbound, records)
    seen = await collect(worker, cat.sent, start, {records[0].id})
    assert [s.receipt.state for s in seen] == ["sent"]
    return time.monotonic() - t0


async def topics_listed(worker: Worker) -> None:
    """Wait until the broker lists the inbound and receipts topics the worker creates."""
    cat = Catalog(worker.prefix)
    deadline = time.monotonic() + WAIT_S
    while not {cat.inbound, cat.sent} <= set(existing_topics(worker.bootstrap)):
        worker.check_alive()
        assert time.monotonic() < deadline, "the worker created no topics"
        await asyncio.sleep(0.1)


async def test_the_worker_joins_only_once_the_broker_lists_its_topics(worker: Worker) -> None:
    cat = Catalog(worker.prefix)
    worker.start()
    line = wait_line(worker, WAITING, timeout=60)
    assert cat.inbound in line and cat.requests in line and cat.control in line
    ensure_topics(worker.bootstrap, cat.specs(partitions=PARTITIONS))
    wait_line(worker, "the broker lists every topic of the group now")

    await answer_one(worker, "late")
    ready = wait_line(worker, "ready: owns partitions")
    assert f"{list(range(PARTITIONS))} of {cat.inbound}" in ready
    assert worker.stop() == 0
    lines = worker.lines()
    assert not [x for x in lines if "Subscribed topic not available" in x], (
        "joined before its topics"
    )
    assert not [x for x in lines if "to force a rebalance" in x]


def test_a_worker_whose_topics_never_appear_exits_naming_them(worker: Worker) -> None:
    cat = Catalog(worker.prefix)
    worker.env = {"BOTMESH_TOPIC_WAIT": "2"}
    child = worker.start()
    assert child.proc is not None
    status = child.proc.wait(timeout=60)
    child.stop()  # reaped: its whole output read
    out = "\n".join(worker.lines())
    assert status == 2, out[-3000:]
    said = [x for x in worker.lines() if x.startswith("botmesh worker: the broker's metadata")]
    assert said, out[-3000:]
    for name in (cat.inbound, cat.requests, cat.control):
        assert f"{name} (not listed)" in said[0]
    assert "BOTMESH_TOPIC_WAIT" in said[0] and "botmesh topics create" in said[0]
    assert "Traceback" not in out
    assert cat.inbound not in existing_topics(worker.bootstrap)


async def test_a_worker_subscribed_before_its_topics_exist_joins_once_they_do(
    worker: Worker,
) -> None:
    """Without the wait for its topics (an earlier release's join): librdkafka's consumer does
    not join the group while no subscribed topic is listed, so it never sits on an empty
    assignment (the hazard a static member's rejoin kept under the Faust runtime, which the
    assignment watch was made for); it joins within moments of the topics' creation and
    answers."""
    cat = Catalog(worker.prefix)
    worker.env = {"BOTMESH_TEST_EARLIER_JOIN": "1"}
    worker.start()
    wait_line(worker, "Subscribed topic not available", cat.inbound, timeout=60)
    assert not [x for x in worker.lines() if "group generation" in x], "joined without topics"
    ensure_topics(worker.bootstrap, cat.specs(partitions=PARTITIONS))
    started = time.monotonic()
    took = await answer_one(worker, "late")
    joined = wait_line(worker, "group generation", "assigned")
    assert f"partitions {list(range(PARTITIONS))} of {cat.inbound}" in joined
    print(f"topics created to first answer {time.monotonic() - started:.1f}s ({took:.1f}s)")
    assert worker.stop() == 0
    assert not [x for x in worker.lines() if "to force a rebalance" in x]


FRESH_STARTS = rounds(quick=5, soak=30)


@pytest.mark.soak
async def test_a_fresh_prefix_answers_its_first_message_on_every_start(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Starts of a worker on a topic prefix it creates itself: each joins with every topic
    listed (no "Subscribed topic not available", no forced rebalance: it never sat on an empty
    assignment), says it owns partitions, and answers its first message (produced once its
    topics exist). The time each took is printed, not asserted: the race this guards
    against left a worker silent for minutes, which the hang guard of the wait catches."""
    times = []
    for i in range(FRESH_STARTS):
        prefix = f"fresh{uuid.uuid4().hex[:8]}x{i}"
        w = Worker(kafka_bootstrap, prefix, tmp_path / str(i), loglevel="info")
        try:
            started = time.monotonic()
            w.start()
            await topics_listed(w)
            took = await answer_one(w, f"first{i}")
            times.append((took, time.monotonic() - started))
            wait_line(w, "ready: owns partitions")
            lines = w.lines()
            assert not [x for x in lines if "Subscribed topic not available" in x]
            assert not [x for x in lines if "to force a rebalance" in x]
        finally:
            w.kill()
            w.close()
            forget_prefix(kafka_bootstrap, prefix)
    answers = sorted(t for t, _ in times)
    print(
        f"{FRESH_STARTS} fresh starts: first answer {answers[0]:.2f}-{answers[-1]:.2f}s after "
        f"its produce, {min(s for _, s in times):.1f}-{max(s for _, s in times):.1f}s after "
        "the start"
    )
