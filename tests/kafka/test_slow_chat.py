"""One chat's provider hangs: the worker keeps answering every other chat meanwhile, and a
SIGKILL in the middle of the hang loses nothing and sends nothing twice.

The recorder (``tests.kafka.recorder``) holds the first send to one chat for ``HOLD_S``
seconds: the message is delivered (recorded) at once, the answer comes that much later,
as from a channel's API that hangs. Inbounds for 30 chats are produced at a steady rate
while the worker (``botmesh worker``, real broker) runs. The worker settles its batches
side by side (``botmesh.streams.worker.loop``): a chat's records wait for its own
earlier records only. So every inbound of the other chats is answered while the held
send still hangs, which the test checks by order (the recorder says when the hold
ended), not by a time limit; their latency (produce call to the provider's call) is
printed. Then the worker is SIGKILLed while the send still hangs, started again with the
same instance id, and more traffic follows: every inbound is accounted for, none sent
twice.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import pytest

from botmesh.streams.clients import AsyncProducer
from botmesh.streams.ops.tools import produce_inbound
from botmesh.topics import Catalog, chat_key, encode_inbound
from tests.kafka.recorder import SESSION_TIMEOUT, Recorder, Tally, check_effects, traffic
from tests.kafka.worker import WAIT_S, Worker, wait_line

pytestmark = [pytest.mark.kafka, pytest.mark.crash]

HOLD_S = 12.0
RATE = 40  # inbounds a second
BEFORE, AFTER = 200, 100  # inbounds before the kill (5 s of traffic) and after it


async def test_a_chat_whose_provider_hangs_holds_up_no_other_chat(
    kafka_bootstrap: str,
    topic_prefix: str,
    tmp_path: Path,
    recorder: Recorder,
    tally: Tally,
) -> None:
    cat = Catalog(topic_prefix)
    worker = Worker(
        kafka_bootstrap,
        topic_prefix,
        tmp_path,
        recorder=recorder.url,
        env=SESSION_TIMEOUT,
        loglevel="info",  # its readiness
    )
    records = traffic("sc", BEFORE + AFTER)
    before, after = records[:BEFORE], records[BEFORE:]
    slow = before[0].chat_id
    others = {r.id for r in before if r.chat_id != slow}
    recorder.hold(slow, HOLD_S)
    produced: dict[str, float] = {}
    try:
        worker.start()
        wait_line(worker, "ready: owns partitions")  # latency from here on, not the start's
        step = RATE // 10
        # one producer for the whole traffic: its pace is the test's, not a producer's start
        producer = AsyncProducer(kafka_bootstrap)
        try:
            for i in range(0, BEFORE, step):  # a tenth of a second's worth at a time
                chunk = before[i : i + step]
                acks = [
                    await producer.send(cat.inbound, encode_inbound(r), key=chat_key(r.chat_id))
                    for r in chunk
                ]
                await asyncio.gather(*acks)
                now = time.monotonic()
                produced.update((r.id, now) for r in chunk)
                await asyncio.sleep(0.1)
        finally:
            await producer.close()
        deadline = time.monotonic() + WAIT_S
        while not others <= tally.accounted(recorder):
            worker.check_alive()
            waiting = len(others - tally.accounted(recorder))
            assert not recorder.held, (
                f"the held send was answered while {waiting} of {len(others)} inbounds of "
                "the other chats still waited: they were held up behind it"
            )
            assert time.monotonic() < deadline, f"{waiting} inbounds of other chats unanswered"
            await asyncio.sleep(0.05)
        assert not recorder.held, "the held send was answered before the other chats were"
        latency = sorted(
            c.at - produced[mid]
            for c in recorder.calls()
            if (mid := c.inbound_id) is not None and mid in others and mid in produced
        )

        worker.kill()  # the held send still hangs: in flight, delivered, not answered
        hung = len(recorder.held) == 0
        worker.start()
        await produce_inbound(kafka_bootstrap, cat.inbound, after)
        ids = {r.id for r in records}
        await tally.until_accounted(recorder, ids, worker.check_alive, WAIT_S)
        assert worker.stop() == 0
    finally:
        recorder.release()
        worker.close()

    out = check_effects(recorder, tally, {r.id for r in records})
    assert hung, "the worker was killed after the held send was answered"
    p50 = statistics.median(latency)
    p99 = latency[min(len(latency) - 1, int(len(latency) * 0.99))]
    print(
        f"  one chat's send held {HOLD_S:g}s: the other chats' {len(latency)} replies came "
        f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {latency[-1] * 1000:.0f} ms "
        f"after their produce call, all before the held send was answered; killed during "
        f"the hold and restarted: {out['lost']} lost, {out['duplicates']} sent twice, "
        f"{out['unknown']} unknown"
    )
