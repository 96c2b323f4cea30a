"""Sends over time, in process: scheduled sends (``at=``/``delay=``), deadlines
(``deliver_within=``/``expires_at=``, ``outbox.deliver_within``), cancelling by key, and
broadcasts (campaigns), on a manual clock and the memory journal (docs/sends-over-time.md).
The Kafka side (real workers, kills, partition moves) is tests/kafka/test_sends_over_time.py.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from botmesh import DeadEvent
from botmesh.errors import (
    DurabilityError,
    InvalidKeyError,
    RateLimitedError,
    Reason,
    RecordStateError,
    SendError,
    SendExpiredError,
)
from botmesh.state.messages import OutboxState
from botmesh.testing import MockProvider
from tests.kit import App, make_app, texts


async def _app(provider: MockProvider | None = None, **options: Any) -> App:
    return await make_app(provider or MockProvider(), **options)


async def _pass(app: App, seconds: float) -> None:
    app.clock.advance(seconds)
    await app.ops.drain()


# -- scheduled sends ------------------------------------------------------------------------


async def test_a_scheduled_send_is_journaled_now_and_goes_out_at_its_time_not_before() -> None:
    app = await _app()
    key = await app.runtime.enqueue("c1", "your appointment is at 9", delay=60)
    record = await app.ops.outbox.get(key)
    assert record is not None and record.state == OutboxState.PENDING
    await _pass(app, 59.0)
    assert texts(app.provider) == []
    await _pass(app, 1.0)
    assert texts(app.provider) == ["your appointment is at 9"]
    await _pass(app, 600.0)
    assert texts(app.provider) == ["your appointment is at 9"]
    assert app.ops.metrics()["outboxScheduled"] == 1


async def test_at_takes_an_aware_datetime_and_refuses_a_naive_one() -> None:
    app = await _app()
    when = datetime.fromtimestamp(app.clock.now() + 30, UTC)
    await app.runtime.enqueue("c1", "at", at=when)
    with pytest.raises(ValueError, match="naive datetime"):
        await app.runtime.enqueue("c1", "x", at=datetime(2030, 1, 1))
    with pytest.raises(ValueError, match="'at' or 'delay', not both"):
        await app.runtime.enqueue("c1", "x", at=when, delay=3)
    with pytest.raises(TypeError, match="'delay' must be seconds or a timedelta"):
        await app.runtime.enqueue("c1", "x", delay="soon")  # type: ignore[arg-type]
    await _pass(app, 29.0)
    assert texts(app.provider) == []
    await _pass(app, 1.0)
    assert texts(app.provider) == ["at"]


async def test_a_scheduled_reply_does_not_hold_up_the_chats_other_sends() -> None:
    app = await _app()
    await app.runtime.enqueue("c1", "later", delay=timedelta(minutes=10))
    receipt = await app.runtime.send("c1", "now")
    assert receipt.state == OutboxState.SENT
    assert texts(app.provider) == ["now"]
    await _pass(app, 600.0)
    assert texts(app.provider) == ["now", "later"]


async def _behind_a_retry() -> App:
    """A scheduled send due in 5 s, and a send of its chat ("first") that failed and waits
    30 s for its retry."""
    provider = MockProvider()
    app = await _app(provider, outbox={"inline_max": 0, "backoff": {"base": "30s", "jitter": 0}})
    await app.runtime.enqueue("c1", "scheduled", delay=5)
    provider.fail_next(SendError("down"))
    with pytest.raises(Exception, match="deferred"):
        await app.runtime.send("c1", "first")
    return app


async def test_a_due_scheduled_send_waits_behind_the_send_its_chat_waits_for() -> None:
    app = await _behind_a_retry()
    await _pass(app, 5.0)  # the scheduled one is due; "first" waits for its retry (30 s)
    assert texts(app.provider) == []
    await _pass(app, 30.0)
    await _pass(app, 1.0)
    assert texts(app.provider) == ["first", "scheduled"]


async def test_a_send_made_after_a_scheduled_one_took_its_turn_goes_after_it() -> None:
    app = await _behind_a_retry()
    await _pass(app, 5.0)  # the scheduled one takes its turn behind "first"
    later = await app.runtime.send("c1", "later")
    assert later.state == OutboxState.PENDING  # behind the scheduled one, not beside it
    for _ in range(4):
        await _pass(app, 30.0)
    assert texts(app.provider) == ["first", "scheduled", "later"]


async def test_scheduled_sends_of_a_chat_go_out_in_the_order_of_their_times() -> None:
    app = await _app()
    await app.runtime.enqueue("c1", "third", delay=30)
    await app.runtime.enqueue("c1", "first", delay=10)
    await app.runtime.enqueue("c1", "second", delay=20)
    await _pass(app, 31.0)
    assert texts(app.provider) == ["first", "second", "third"]


async def test_a_scheduled_send_needs_a_journal() -> None:
    from botmesh import Bot, run

    async with run(Bot("nojournal"), MockProvider(), journal=None) as app:
        with pytest.raises(DurabilityError, match="scheduled"):
            await app.enqueue("c1", "x", delay=5)


# -- cancelling -------------------------------------------------------------------------------


async def test_a_cancelled_scheduled_send_never_goes_out_and_its_key_stays_cancelled() -> None:
    app = await _app()
    key = await app.runtime.enqueue("c1", "reminder", delay=60, idempotency_key="remind-1")
    receipt = await app.bot.cancel(key)
    assert receipt.state == OutboxState.CANCELLED
    assert (await app.runtime.cancel(key)).state == OutboxState.CANCELLED  # again: the same
    await _pass(app, 120.0)
    assert texts(app.provider) == []
    again = await app.runtime.send("c1", "reminder", idempotency_key="remind-1")
    assert again.state == OutboxState.CANCELLED
    assert texts(app.provider) == []
    assert app.ops.metrics()["outboxCancelled"] == 1


async def test_cancel_refuses_a_sent_send_and_an_unknown_key_naming_why() -> None:
    app = await _app()
    await app.runtime.send("c1", "hi", idempotency_key="k1")
    with pytest.raises(RecordStateError, match="already settled"):
        await app.runtime.cancel("k1")
    with pytest.raises(RecordStateError, match="no send under this key"):
        await app.runtime.cancel("never")


async def test_cancelling_a_split_text_cancels_its_later_parts() -> None:
    provider = MockProvider(text_limit=10)
    app = await _app(provider)
    await app.runtime.enqueue("c1", "0123456789" * 3, delay=5, idempotency_key="long")
    await app.runtime.cancel("long")
    await _pass(app, 10.0)
    assert texts(provider) == []
    states = {r.key: r.state for r in await app.ops.outbox.list()}
    assert states == dict.fromkeys(("long", "long#2", "long#3"), OutboxState.CANCELLED)


# -- deadlines --------------------------------------------------------------------------------


async def test_a_send_past_its_deadline_dies_expired_instead_of_going_out_late() -> None:
    provider = MockProvider()
    events: list[Any] = []
    app = await _app(provider, outbox={"inline_max": 0, "backoff": {"base": "5s", "jitter": 0}})
    app.bot.on(DeadEvent, events.append)
    provider.fail_next(SendError("down"), times=1)
    with pytest.raises(Exception, match="deferred"):
        await app.runtime.send("c1", "code 1234", idempotency_key="otp", deliver_within=10)
    await _pass(app, 30.0)
    assert texts(provider) == []
    record = await app.ops.outbox.get("otp")
    assert record is not None and record.state == OutboxState.DEAD
    assert record.error is not None and record.error["reason"] == Reason.EXPIRED
    assert [e.reason for e in events] == [Reason.EXPIRED]
    assert app.ops.metrics()["outboxExpired"] == 1


async def test_a_retry_after_past_the_deadline_expires_the_send_inline() -> None:
    provider = MockProvider()
    app = await _app(provider)
    provider.fail_next(RateLimitedError(retry_after=120))
    with pytest.raises(SendExpiredError) as raised:
        await app.runtime.send("c1", "code", idempotency_key="otp2", deliver_within=60)
    assert raised.value.key == "otp2"
    record = await app.ops.outbox.get("otp2")
    assert record is not None and record.state == OutboxState.DEAD
    assert record.error is not None and record.error["reason"] == Reason.EXPIRED


async def test_an_ambiguous_send_past_its_deadline_is_unknown_never_expired_nor_resent() -> None:
    provider = MockProvider()
    app = await _app(provider, outbox={"on_ambiguous": "resend", "lease": "5s"})
    engine = app.engine
    # a send left in flight by a crash: journaled in flight, its holder gone
    now = app.clock.now()
    await engine.kv.commit([_inflight(engine.out_prefix + "amb", now, deadline=now + 1)])
    await _pass(app, 30.0)
    record = await app.ops.outbox.get("amb")
    assert record is not None and record.state == OutboxState.UNKNOWN
    assert record.error is not None and record.error["reason"] == Reason.AMBIGUOUS
    assert texts(provider) == []


class _Resolving(MockProvider):
    """A channel that can tell a send never arrived."""

    async def resolve_ambiguous(self, message: Any, key: str, since: float) -> None:
        return None


async def test_an_ambiguous_send_the_channel_says_never_arrived_expires_past_its_deadline() -> None:
    provider = _Resolving()
    app = await _app(provider, outbox={"lease": "5s"})
    engine = app.engine
    now = app.clock.now()
    await engine.kv.commit([_inflight(engine.out_prefix + "amb", now, deadline=now + 1)])
    await _pass(app, 30.0)
    record = await app.ops.outbox.get("amb")
    assert record is not None and record.state == OutboxState.DEAD
    assert record.error is not None and record.error["reason"] == Reason.EXPIRED
    assert texts(provider) == []


async def test_the_policy_deadline_applies_to_every_send_without_its_own() -> None:
    provider = MockProvider()
    app = await _app(provider, outbox={"deliver_within": "15s", "inline_max": 0})
    provider.fail_next(SendError("down"), times=1)
    with pytest.raises(Exception, match="deferred"):
        await app.runtime.send("c1", "late", idempotency_key="p1")
    await _pass(app, 60.0)
    record = await app.ops.outbox.get("p1")
    assert record is not None and record.error is not None
    assert record.error["reason"] == Reason.EXPIRED


async def test_a_scheduled_send_counts_its_deadline_from_its_time() -> None:
    app = await _app()
    await app.runtime.enqueue("c1", "soon", delay=100, deliver_within=10, idempotency_key="s")
    await _pass(app, 100.0)
    assert texts(app.provider) == ["soon"]
    with pytest.raises(ValueError, match="not after its time"):
        await app.runtime.enqueue(
            "c1", "x", delay=100, expires_at=app.clock.now() + 50, idempotency_key="s2"
        )


async def test_an_operator_retry_of_an_expired_send_sends_it() -> None:
    provider = MockProvider()
    app = await _app(provider)
    provider.fail_next(RateLimitedError(retry_after=120))
    with pytest.raises(SendExpiredError):
        await app.runtime.send("c1", "x", idempotency_key="e1", deliver_within=60)
    await app.ops.retry_send("e1")
    await _pass(app, 1.0)
    assert texts(provider) == ["x"]


# -- broadcasts ---------------------------------------------------------------------------


async def test_a_broadcast_sends_each_recipient_once_even_when_started_again() -> None:
    app = await _app()
    chats = [f"u{i}" for i in range(50)]
    campaign = await app.runtime.broadcast([*chats, "u1"], "sale!", campaign="dec", concurrency=4)
    assert campaign.journaled == 50
    await _pass(app, 1.0)
    again = await app.bot.broadcast(chats, "sale!", campaign="dec")
    await _pass(app, 1.0)
    assert sorted(m.chat_id for m in app.provider.sent) == sorted(chats)
    status = await again.status()
    assert (status.sent, status.pending, status.total) == (50, 0, 50)
    assert {r.key for r in await app.ops.outbox.list()} == {f"campaign:dec:{c}" for c in chats}


async def test_a_cancelled_campaign_sends_nothing_more_even_when_started_again() -> None:
    app = await _app()
    chats = [f"u{i}" for i in range(20)]
    first = await app.runtime.broadcast(chats[:5], "hi", campaign="c1")
    await _pass(app, 1.0)
    campaign = await app.runtime.broadcast(chats, "hi", campaign="c1", delay=60)
    status = await campaign.cancel()
    assert (status.sent, status.cancelled) == (5, 15)
    await app.runtime.broadcast(chats, "hi", campaign="c1")
    await _pass(app, 120.0)
    assert len(app.provider.sent) == 5
    assert (await first.status()).cancelled == 15


async def test_a_broadcast_refuses_bad_campaign_ids_and_concurrency() -> None:
    app = await _app()
    with pytest.raises(InvalidKeyError, match="must not contain ':'"):
        await app.runtime.broadcast(["a"], "x", campaign="a:b")
    with pytest.raises(ValueError, match="concurrency"):
        await app.runtime.broadcast(["a"], "x", campaign="a", concurrency=0)
    with pytest.raises(ValueError, match="non-empty strings"):
        await app.runtime.broadcast(["a", ""], "x", campaign="a")
    with pytest.raises(ValueError, match="drop idempotency_key"):
        await app.runtime.broadcast(["a"], "x", campaign="a", idempotency_key="k")
    with pytest.raises(ValueError, match="naive datetime"):  # itself, not in a group
        await app.runtime.broadcast(["a", "b"], "x", campaign="a", at=datetime(2030, 1, 1))
    with pytest.raises(ValueError, match="needs text or media"):
        await app.runtime.broadcast(["a", "b"], None, campaign="a")
    assert await app.ops.outbox.list() == []  # nothing journaled


async def test_a_campaigns_status_counts_expired_and_dead_apart() -> None:
    provider = MockProvider()
    app = await _app(provider, outbox={"retries": 0})
    provider.fail_chat("bad", SendError("nope", retryable=False))
    await app.runtime.broadcast(["ok", "bad"], "x", campaign="m")
    await app.runtime.broadcast(["late"], "x", campaign="m", expires_at=app.clock.now() - 1)
    await _pass(app, 1.0)
    status = await (await app.runtime.campaign("m")).status()
    assert (status.sent, status.dead, status.expired) == (1, 1, 1)


def _inflight(key: str, now: float, *, deadline: float) -> Any:
    from botmesh.state.kv import handover

    value = {
        "key": key.rsplit("/", 1)[-1],
        "state": "pending",
        "attempts": 1,
        "token": 1,
        "inflight": True,
        "lease": {"owner": "gone", "boot": "b0", "until": now + 1},
        "payload": {"chat_id": "c1", "text": "maybe sent"},
        "deadline": deadline,
        "created": now,
        "updated": now,
    }
    return handover(key, value, expect=0, due=now + 1)


# -- the sweeper delivers several chats at a time -----------------------------------------


async def test_the_sweeper_delivers_several_chats_at_a_time_and_each_chat_in_order() -> None:
    from tests.kit import GatedProvider

    provider = GatedProvider()
    app = await _app(provider, outbox={"sweep_at_once": 3})
    for chat in ("a", "b", "c", "d"):
        await app.runtime.enqueue(chat, f"{chat}1")
        app.clock.advance(0.001)  # due one after the other
        await app.runtime.enqueue(chat, f"{chat}2")
        app.clock.advance(0.001)
    sweep = asyncio.ensure_future(app.ops.sweep_once())
    await _until(lambda: provider.calling == 3)  # three chats at once, the fourth waits
    provider.release.set()
    await sweep
    await app.ops.drain()
    sent = [t or "" for t in texts(provider)]
    assert sorted(sent) == sorted(f"{c}{n}" for c in "abcd" for n in (1, 2))
    for chat in "abcd":  # each chat's sends in the order they were made
        assert sent.index(f"{chat}1") < sent.index(f"{chat}2")


async def test_sweep_at_once_1_delivers_one_send_after_another() -> None:
    from tests.kit import GatedProvider

    provider = GatedProvider()
    app = await _app(provider, outbox={"sweep_at_once": 1})
    for chat in ("a", "b"):
        await app.runtime.enqueue(chat, chat)
        app.clock.advance(0.001)
    sweep = asyncio.ensure_future(app.ops.sweep_once())
    await _until(lambda: provider.calling == 1)
    for _ in range(20):
        await asyncio.sleep(0)
    assert provider.calling == 1
    provider.release.set()
    await sweep
    assert texts(provider) == ["a", "b"]


async def _until(cond: Any) -> None:
    for _ in range(1000):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def test_a_sweeper_pass_that_took_its_limit_is_followed_at_once_by_the_next() -> None:
    from botmesh.state.scheduler import PASS_LIMIT

    app = await _app()
    for i in range(PASS_LIMIT + 1):
        await app.runtime.enqueue(f"c{i}", "news")
    wake = app.engine.common.wake
    wake.clear()
    assert await app.ops.sweep_once() == PASS_LIMIT
    assert wake.is_set()  # the scheduler runs the next pass now, not a poll later
    wake.clear()
    assert await app.ops.sweep_once() == 1
    assert not wake.is_set()
