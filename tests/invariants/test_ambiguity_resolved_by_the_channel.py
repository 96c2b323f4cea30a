"""Beyond the reference: a channel that can tell whether a send went out (Discord's nonce, a
channel API that lists recent messages) is asked, and the ``on_ambiguous`` guess is only the
fallback when it cannot tell. A resolved send is counted (``outboxResolvedSent`` /
``outboxResolvedUnsent``), never in ``outboxAmbiguous``, and fires no ``AmbiguousEvent``.

The channel here is in process (the provider itself is what we fake); its ``resolve_ambiguous``
looks the key up among what it accepted, as the adapters do at their channel's API."""

from __future__ import annotations

from typing import Literal

import pytest

from botmesh import AmbiguousEvent, Bot
from botmesh.journal import MemoryKv, Write
from botmesh.state.messages import Outbound, SendResult
from botmesh.state.ports import AmbiguityResolver, KeyedSends
from botmesh.testing import ManualClock, MockProvider, SimulatedCrash, crashable
from tests.kit import make_app, policy

pytestmark = pytest.mark.crash

Policy = Literal["skip", "resend"]


class AskingChannel(MockProvider):
    """Keeps the key of each accepted send, as a channel that stores a nonce does.
    ``die_before_sending``: the next call dies before the request leaves the process.
    ``cannot_tell``: ``resolve_ambiguous`` raises, as when the channel's window passed."""

    def __init__(self) -> None:
        super().__init__("asking")
        self.by_key: dict[str, str] = {}
        self.keys: list[str] = []
        self.asked: list[str] = []
        self.die_before_sending = False
        self.cannot_tell = False

    async def send_keyed(self, message: Outbound, key: str) -> SendResult:
        self.keys.append(key)
        if self.die_before_sending:
            self.die_before_sending = False
            raise SimulatedCrash("dead", "before the request left", 0)
        result = await self.send(message)
        self.by_key[key] = result.message_id
        return result

    async def resolve_ambiguous(
        self, message: Outbound, key: str, since: float
    ) -> SendResult | None:
        self.asked.append(key)
        if self.cannot_tell:
            raise RuntimeError("the channel's window for this send has passed")
        found = self.by_key.get(key)
        return SendResult(found) if found is not None else None


def _bot(on_ambiguous: Policy, events: list[AmbiguousEvent]) -> Bot:
    bot = Bot("bot", durability=policy(outbox={"on_ambiguous": on_ambiguous}))
    bot.on(AmbiguousEvent, events.append)
    return bot


def test_the_channel_implements_both_capabilities() -> None:
    channel = AskingChannel()
    assert isinstance(channel, KeyedSends) and isinstance(channel, AmbiguityResolver)
    assert not isinstance(MockProvider(), AmbiguityResolver)


@pytest.mark.parametrize("on_ambiguous", ["skip", "resend"])
async def test_a_send_that_went_out_is_recorded_sent_and_not_sent_again(
    on_ambiguous: Policy,
) -> None:
    shared, clock, channel = MemoryKv(), ManualClock(), AskingChannel()
    a = crashable(shared)
    a.crash_before(Write.OUTBOX_MARK_SENT)  # the channel got it; the journal never heard back
    first = await make_app(channel, kv=a, clock=clock)
    with pytest.raises(SimulatedCrash):
        await first.runtime.send("c", "hello", idempotency_key="k")
    assert channel.keys == ["k"] and len(channel.sent) == 1
    mid = channel.by_key["k"]

    events: list[AmbiguousEvent] = []
    again = await make_app(channel, kv=shared, clock=clock, bot=_bot(on_ambiguous, events))
    rec = await again.ops.outbox.get("k")
    assert rec is not None and rec.state == "sent" and rec.message_id == mid
    assert channel.asked == ["k"] and len(channel.sent) == 1  # asked, never sent again
    m = again.ops.metrics()
    assert (m["outboxResolvedSent"], m["outboxResolvedUnsent"], m["outboxAmbiguous"]) == (1, 0, 0)
    assert events == []


@pytest.mark.parametrize("on_ambiguous", ["skip", "resend"])
async def test_a_send_that_never_left_is_sent_once_even_under_skip(on_ambiguous: Policy) -> None:
    shared, clock, channel = MemoryKv(), ManualClock(), AskingChannel()
    channel.die_before_sending = True  # journaled in flight; the process died before the call
    first = await make_app(channel, kv=shared, clock=clock)
    with pytest.raises(SimulatedCrash):
        await first.runtime.send("c", "hello", idempotency_key="k")
    assert channel.sent == []

    events: list[AmbiguousEvent] = []
    again = await make_app(channel, kv=shared, clock=clock, bot=_bot(on_ambiguous, events))
    rec = await again.ops.outbox.get("k")
    assert rec is not None and rec.state == "sent"
    assert [m.text for m in channel.sent] == ["hello"]  # "skip" alone would have lost it
    m = again.ops.metrics()
    assert (m["outboxResolvedSent"], m["outboxResolvedUnsent"], m["outboxAmbiguous"]) == (0, 1, 0)
    assert events == []


@pytest.mark.parametrize("on_ambiguous", ["skip", "resend"])
async def test_when_the_channel_cannot_tell_the_policy_decides(on_ambiguous: Policy) -> None:
    shared, clock, channel = MemoryKv(), ManualClock(), AskingChannel()
    a = crashable(shared)
    a.crash_before(Write.OUTBOX_MARK_SENT)
    first = await make_app(channel, kv=a, clock=clock)
    with pytest.raises(SimulatedCrash):
        await first.runtime.send("c", "hello", idempotency_key="k")
    channel.cannot_tell = True

    events: list[AmbiguousEvent] = []
    again = await make_app(channel, kv=shared, clock=clock, bot=_bot(on_ambiguous, events))
    rec = await again.ops.outbox.get("k")
    assert rec is not None and rec.ambiguous and channel.asked == ["k"]
    resent = on_ambiguous == "resend"
    assert rec.state == ("sent" if resent else "unknown")
    assert len(channel.sent) == (2 if resent else 1)
    m = again.ops.metrics()
    assert (m["outboxResolvedSent"], m["outboxResolvedUnsent"], m["outboxAmbiguous"]) == (0, 0, 1)
    assert events == [AmbiguousEvent("k", "c", resent=resent)]


async def test_each_part_of_a_split_send_gets_its_own_key() -> None:
    channel = AskingChannel()
    channel.text_limit = 3
    app = await make_app(channel)
    await app.runtime.send("c", "aa bb cc", idempotency_key="k")
    assert channel.keys == ["k", "k#2", "k#3"]
