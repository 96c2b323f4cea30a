"""Operating a running bot (``app.durability``): counters, lists, replay, retry, retention."""

from __future__ import annotations

import pytest

from botmesh import Bot, Context, Inbound
from botmesh.errors import RecordStateError, SendDeferredError, SendError, UnsupportedContentError
from botmesh.journal import MemoryKv, Write
from botmesh.state.counters import Metric
from botmesh.testing import ManualClock, SimulatedCrash, crashable
from tests.kit import make_app, policy, texts

REFERENCE_COUNTERS = [
    "inboundJournaled",
    "inboundDuplicates",
    "inboundReplayed",
    "inboundDead",
    "outboxJournaled",
    "outboxDeduped",
    "outboxRetried",
    "outboxDeferred",
    "outboxDead",
    "outboxAmbiguous",
    "outboxBypassed",
    "staleLeases",
    "outboxDiverged",
]
#: Ours, beyond the reference: ambiguous sends resolved by asking the channel, sends a
#: standby left to the provider leader, sends over time (scheduled, expired, cancelled),
#: sends paced under the rate limits (and how long).
OUR_COUNTERS = [
    "outboxResolvedSent",
    "outboxResolvedUnsent",
    "providerNotLeader",
    "outboxScheduled",
    "outboxExpired",
    "outboxCancelled",
    "outboxPaced",
    "outboxPacedMs",
    "deliveryUpdates",
    "deliveryFailed",
    "deliveryUnchanged",
    "deliveryUnmatched",
    "outboxEdits",
]


async def test_metrics_have_the_thirteen_reference_names_then_ours() -> None:
    app = await make_app()
    names = REFERENCE_COUNTERS + OUR_COUNTERS
    assert list(app.ops.metrics()) == [m.value for m in Metric] == names
    assert set(app.ops.metrics().values()) == {0}
    assert app.runtime.metrics() == app.ops.metrics()


@pytest.mark.crash
async def test_retry_send_takes_failed_and_unknown_sends() -> None:
    app = await make_app(outbox={"inline_max": 0})
    app.provider.fail_next(SendError("down"))
    with pytest.raises(SendDeferredError):
        await app.runtime.send("c", "x", idempotency_key="f")
    await app.ops.retry_send("f")  # failed -> pending now, not at its backoff time
    await app.ops.sweep_once()
    rec = await app.ops.outbox.get("f")
    assert rec is not None and rec.state == "sent"

    shared, clock = MemoryKv(), ManualClock()
    a = crashable(shared)
    a.crash_after(Write.OUTBOX_JOURNAL)  # in flight when the process died
    first = await make_app(kv=a, clock=clock)
    with pytest.raises(SimulatedCrash):
        await first.runtime.send("c", "y", idempotency_key="u")
    again = await make_app(kv=shared, clock=clock)
    rec = await again.ops.outbox.get("u")
    assert rec is not None and rec.state == "unknown"
    await again.ops.retry_send("u")
    await again.ops.drain()
    rec = await again.ops.outbox.get("u")
    assert rec is not None and rec.state == "sent" and texts(again.provider) == ["y"]


async def test_replay_inbound_processes_a_done_message_again() -> None:
    bot = Bot("bot", durability=policy())
    runs = 0

    @bot.on_message
    async def handler(ctx: Context) -> None:
        nonlocal runs
        runs += 1
        await ctx.reply("hello")

    app = await make_app(bot=bot)
    await app.runtime.handle(Inbound(id="m", chat_id="c"))
    await app.ops.replay_inbound("m")
    rec = await app.ops.inbox.get("m")
    assert rec is not None and (rec.state, rec.attempts) == ("pending", 0)
    await app.ops.drain()
    assert runs == 2 and len(app.provider.sent) == 1  # its reply answered from the outbox
    assert app.ops.metrics()["inboundReplayed"] == 1 and app.ops.metrics()["outboxDeduped"] == 1
    assert [r.id for r in await app.ops.inbox.list(state="done")] == ["m"]
    assert await app.ops.inbox.list(state="dead") == []
    with pytest.raises(RecordStateError):
        await app.ops.replay_inbound("missing")


@pytest.mark.parametrize(("retention", "kept"), [("1d", False), (0, True)])
async def test_retention_purges_done_and_sent_and_keeps_dead(retention: object, kept: bool) -> None:
    app = await make_app(retention=retention, reply="hello")
    await app.runtime.handle(Inbound(id="m", chat_id="c"))
    app.provider.fail_next(UnsupportedContentError("no"))
    with pytest.raises(UnsupportedContentError):
        await app.runtime.send("c", "x", idempotency_key="dead-one")
    app.clock.advance(86400 - 1)
    assert await app.ops.sweep_once() == 0
    app.clock.advance(2)
    await app.ops.sweep_once()
    remaining = {r.key for r in await app.ops.outbox.list()} | {
        r.id for r in await app.ops.inbox.list()
    }
    assert remaining == ({"m", "m:1", "dead-one"} if kept else {"dead-one"})  # dead stays
