"""Invariant 4, ambiguity is explicit: a send found in flight after a crash becomes
``unknown`` (``on_ambiguous="skip"``, never a duplicate) or is sent again (``"resend"``,
never lost), and ``AmbiguousEvent`` fires either way."""

from __future__ import annotations

from typing import Literal

import pytest

from botmesh import AmbiguousEvent, Bot
from botmesh.errors import Reason
from botmesh.journal import MemoryKv, Write
from botmesh.testing import CrashableProvider, ManualClock, MockProvider, SimulatedCrash, crashable
from tests.kit import make_app, policy, settle, texts

pytestmark = pytest.mark.crash

Policy = Literal["skip", "resend"]


@pytest.mark.parametrize("on_ambiguous", ["skip", "resend"])
async def test_a_send_in_flight_at_a_crash_is_resolved_by_the_policy(
    on_ambiguous: Policy,
) -> None:
    shared, clock = MemoryKv(), ManualClock()
    a = crashable(shared)
    a.crash_before(Write.OUTBOX_MARK_SENT)  # the provider was called, the result never recorded
    first = await make_app(kv=a, clock=clock)
    with pytest.raises(SimulatedCrash):
        await first.runtime.send("c", "hello", idempotency_key="k")
    assert len(first.provider.sent) == 1  # the channel got it; the journal never heard back

    bot = Bot("bot", durability=policy(outbox={"on_ambiguous": on_ambiguous}))
    events: list[AmbiguousEvent] = []
    bot.on(AmbiguousEvent, events.append)
    again = await make_app(kv=shared, clock=clock, bot=bot)  # recovers at start
    rec = await again.ops.outbox.get("k")
    assert rec is not None and rec.ambiguous
    assert again.ops.metrics()["outboxAmbiguous"] == 1
    assert events == [AmbiguousEvent("k", "c", resent=on_ambiguous == "resend")]
    if on_ambiguous == "skip":
        assert rec.state == "unknown" and again.provider.sent == []  # never a duplicate
        assert rec.error is not None and rec.error["reason"] == Reason.AMBIGUOUS
    else:
        assert rec.state == "sent" and texts(again.provider) == ["hello"]  # never lost


PARTS = ["aa ", "bb ", "cc ", "dd ", "ee"]


@pytest.mark.parametrize("path", ["inline", "enqueued"])
@pytest.mark.parametrize("on_ambiguous", ["skip", "resend"])
async def test_a_split_text_never_arrives_with_a_hole(path: str, on_ambiguous: Policy) -> None:
    """Killed in the ambiguous window of part 3 of 5: under "skip" parts 4 and 5 share its
    fate (the chat sees 11100, never 11011 or 11101); under "resend" the text arrives whole."""
    shared, clock = MemoryKv(), ManualClock()
    a = crashable(shared)
    channel = MockProvider(text_limit=3)
    bot = Bot("bot", durability=policy(outbox={"on_ambiguous": on_ambiguous}))
    first = await make_app(CrashableProvider(a, channel), kv=a, clock=clock, bot=bot)
    a.crash_before(Write.OUTBOX_MARK_SENT, 3)  # part 3 went out, its outcome is lost
    with pytest.raises(SimulatedCrash):
        if path == "inline":
            await first.runtime.send("c", "".join(PARTS), idempotency_key="k")
        else:
            await first.runtime.enqueue("c", "".join(PARTS), idempotency_key="k")
            await first.ops.drain()
    assert texts(channel) == PARTS[:3]

    again = await make_app(channel, kv=shared, clock=clock, bot=bot)
    await settle(again)
    recs = {r.key: r for r in await again.ops.outbox.list()}
    states = [recs[k].state for k in ("k", "k#2", "k#3", "k#4", "k#5")]
    if on_ambiguous == "skip":
        assert states == ["sent", "sent", "unknown", "unknown", "unknown"]
        assert texts(channel) == PARTS[:3]  # parts 4 and 5 never went out
        assert recs["k#3"].ambiguous and recs["k#3"].error is not None
        assert recs["k#3"].error["reason"] == Reason.AMBIGUOUS
        for k in ("k#4", "k#5"):
            error = recs[k].error
            assert error is not None and error["reason"] == Reason.PREVIOUS_PART_UNKNOWN, k
            assert not recs[k].ambiguous and recs[k].attempts == 0  # never tried
        assert again.ops.metrics()["outboxAmbiguous"] == 1
    else:
        assert states == ["sent"] * 5
        assert texts(channel) == [*PARTS[:3], "cc ", "dd ", "ee"]  # whole, part 3 twice
