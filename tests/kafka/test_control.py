"""Operator actions through the chat's owner, and dead letters copied by the journal, in the
worker's inbound path (``botmesh.streams.runner``) without Kafka: plain records through the REAL
runtime on a journal from the fault kit; the producer is the one stand-in (``Produced``).

The same paths run on a real broker in ``test_dlq.py``.
"""

from __future__ import annotations

import json
import time

from botmesh import Bot, Context, Outcome
from botmesh.errors import RateLimitedError, RecipientUnreachableError
from botmesh.journal import MemoryKv
from botmesh.streams.runner import InboundRunner, RawRecord
from botmesh.streams.sink import KafkaReceipts
from botmesh.testing import MockProvider
from botmesh.topics.control import ControlRequest, decode_result, encode_control
from tests.kafka.test_runner import (
    REQUESTS,
    Produced,
    Waits,
    crashed_with_a1_journaled,
    make_bot,
    record,
    request,
)

CONTROL = "t.control"


def control(  # noqa: PLR0917 (as the other record builders of these tests)
    offset: int, ts: float, chat: str, rid: str, action: str, target: str
) -> RawRecord:
    value = encode_control(
        ControlRequest(id=rid, chat_id=chat, action=action, target=target, by="test")  # type: ignore[arg-type]
    )
    return RawRecord(CONTROL, 0, offset, chat.encode(), value, [], ts)


def results(produced: Produced) -> list[tuple[str, str | None, str]]:
    out: list[tuple[str, str | None, str]] = []
    for role, key, value, _ in produced.records:
        if role == "control-results":
            r = decode_result(value)
            assert key == r.id.encode()
            out.append((r.outcome, r.state, r.action))
    return out


def sent(provider: MockProvider) -> list[str | None]:
    """The texts the provider accepted, in order."""
    return [c.message.text for c in provider.calls if c.error is None]


def runner_of(rt: object, produced: Produced) -> InboundRunner:
    return InboundRunner(
        rt,  # type: ignore[arg-type]
        produced,
        sleep=Waits(),
        requests_topic=REQUESTS,
        control_topic=CONTROL,
        instance="w",
    )


async def test_a_dead_send_is_copied_to_the_outbox_dlq_and_retried_once_through_control() -> None:
    """A request the provider refuses for good: its send is dead, with one dead letter on
    ``outbox.dlq``. ``retry_send`` through the control topic revives it; the sweeper sends it
    once; a second ``retry_send`` of the send now ``sent`` is refused and sends nothing."""
    provider, produced = MockProvider(), Produced()
    provider.fail_next(RecipientUnreachableError("no such user"))
    async with make_bot([]).bind(
        provider, MemoryKv(), instance_id="w", receipts=KafkaReceipts(produced)
    ) as rt:
        runner = runner_of(rt, produced)
        await runner.run_batch([request(0, 1.0, "A", "r1", "hello")])
        [dead] = [r for r in produced.records if r[0] == "outbox-dlq"]
        headers = {k: v.decode() for k, v in dead[3]}
        assert (headers["reason"], headers["idempotency.key"]) == ("send-refused", "req:r1")
        assert sent(provider) == []

        await runner.run_batch([control(1, 2.0, "A", "c1", "retry_send", "req:r1")])
        assert rt.durability is not None
        await rt.durability.drain()
        assert sent(provider) == ["hello"]
        await runner.run_batch([control(2, 3.0, "A", "c2", "retry_send", "req:r1")])
        await rt.durability.drain()
    assert sent(provider) == ["hello"]  # sent once
    assert results(produced) == [
        ("done", "pending", "retry_send"),
        ("refused", "sent", "retry_send"),
    ]
    assert runner.actions == {"done": 1, "refused": 1}
    assert len([r for r in produced.records if r[0] == "outbox-dlq"]) == 1


async def test_a_dead_inbound_is_copied_by_the_journal_once_and_replayed_through_control() -> None:
    """A real crash after the inbound was journaled with ``inbox.max_attempts=1``: on its
    redelivery the journal marks it dead and copies it to ``inbound.dlq`` with its headers;
    the runner adds no copy, and a further redelivery none either. ``replay_inbound`` through
    the control topic runs its handler again."""
    seen: list[str] = []
    bot, shared = await crashed_with_a1_journaled(seen)
    produced, provider = Produced(), MockProvider()
    async with bot.bind(provider, shared, instance_id="w", receipts=KafkaReceipts(produced)) as rt:
        runner = runner_of(rt, produced)
        await runner.run_batch([record(5, "A", "A1")])
        await runner.run_batch([record(5, "A", "A1")])  # delivered again: no second copy
        assert runner.outcomes == {Outcome.DEAD: 2}
        [(_, key, value, headers)] = [r for r in produced.records if r[0] == "dlq"]
        dead = {k: v.decode() for k, v in headers}
        assert (key, json.loads(value)["id"]) == (b"A", "A1")
        assert (dead["reason"], dead["inbound.id"], dead["chat.id"]) == (
            "attempts-exhausted",
            "A1",
            "A",
        )
        assert (dead["source.topic"], dead["source.partition"], dead["source.offset"]) == (
            "t.inbound",
            "0",
            "5",
        )
        assert seen == []
        await runner.run_batch([control(0, 1.0, "A", "c1", "replay_inbound", "A1")])
        assert rt.durability is not None
        await rt.durability.drain()
    assert seen == ["A1"]
    assert sent(provider) == ["re hi"]
    assert results(produced) == [("done", "pending", "replay_inbound")]


async def test_a_dead_letter_produced_again_to_the_inbound_is_redriven_by_its_id() -> None:
    """An operator re-produces a dead inbound's dead letter to the inbound topic (kcat): it
    arrives under a new offset with the same id; the journal recognises it and runs it
    again with a fresh budget; its original offset delivered again stays dead."""
    seen: list[str] = []
    bot, shared = await crashed_with_a1_journaled(seen)
    produced, provider = Produced(), MockProvider()
    async with bot.bind(provider, shared, instance_id="w", receipts=KafkaReceipts(produced)) as rt:
        runner = runner_of(rt, produced)
        await runner.run_batch([record(5, "A", "A1")])
        assert seen == []
        await runner.run_batch([record(9, "A", "A1")])  # the redrive: a new offset
        assert seen == ["A1"]
        # delivered again from where it was journaled now (an offset replay): its handler
        # runs again, its reply is answered from the outbox
        await runner.run_batch([record(9, "A", "A1")])
        await runner.run_batch([record(5, "A", "A1")])  # the old offset: a duplicate
    assert sent(provider) == ["re hi"]
    assert runner.outcomes[Outcome.DEAD] == 1
    assert runner.outcomes[Outcome.DUPLICATE] == 1
    assert len([r for r in produced.records if r[0] == "dlq"]) == 1


async def test_discard_and_unknown_targets_answer_with_results() -> None:
    provider, produced = MockProvider(), Produced()
    provider.fail_next(RecipientUnreachableError("no such user"))
    async with make_bot([]).bind(
        provider, MemoryKv(), instance_id="w", receipts=KafkaReceipts(produced)
    ) as rt:
        runner = runner_of(rt, produced)
        await runner.run_batch([request(0, 1.0, "A", "r1", "hello")])
        await runner.run_batch(
            [
                control(1, 2.0, "A", "c1", "discard", "req:r1"),
                control(2, 3.0, "A", "c2", "retry_send", "req:r1"),
                control(3, 4.0, "A", "c3", "replay_inbound", "nope"),
            ]
        )
        assert rt.durability is not None
        assert await rt.durability.outbox.get("req:r1") is None
    assert results(produced) == [
        ("done", None, "discard"),
        ("refused", None, "retry_send"),
        ("refused", None, "replay_inbound"),
    ]


async def test_a_malformed_control_record_goes_to_the_requests_dlq_and_the_chat_goes_on() -> None:
    produced = Produced()
    async with make_bot([]).bind(
        MockProvider(), MemoryKv(), instance_id="w", receipts=KafkaReceipts(produced)
    ) as rt:
        runner = runner_of(rt, produced)
        bad = RawRecord(CONTROL, 0, 0, b"A", b'{"v": 1, "id": "x"}', [], 1.0)
        await runner.run_batch([bad, control(1, 2.0, "A", "c1", "discard", "nothing")])
    [(_, _, _, headers)] = [r for r in produced.records if r[0] == "requests-dlq"]
    dead = {k: v.decode() for k, v in headers}
    assert (dead["reason"], dead["source.topic"]) == ("wrong-type", CONTROL)
    assert results(produced) == [("refused", None, "discard")]


async def test_a_failed_send_is_parked_on_its_tier_and_retried_once_when_it_comes_back() -> None:
    """A reply refused with 429 and Retry-After 3 s, past ``inline_max``: the journal records
    it failed and the sink gets its retry record on the 5 s tier (never earlier than asked).
    Coming back, the send goes out once; the same record delivered again does nothing."""
    provider, produced = MockProvider(), Produced()
    provider.fail_next(RateLimitedError("slow down", retry_after=3.0))
    bot = Bot("tiers", durability={"poll": 0, "outbox": {"inline_max": 0.0}})

    @bot.on_message
    async def reply(ctx: Context) -> None:
        await ctx.reply("hello")

    async with bot.bind(
        provider, MemoryKv(), instance_id="w", receipts=KafkaReceipts(produced)
    ) as rt:
        runner = runner_of(rt, produced)
        before = time.time()
        await runner.run_batch([record(0, "A", "A1")])
        [(role, key, value, headers)] = [r for r in produced.records if r[0].startswith("retry:")]
        parked = json.loads(value)
        assert (role, key, parked["key"], parked["attempts"]) == ("retry:5s", b"A", "A1:1", 1)
        assert parked["retry_at"] >= before + 5.0
        assert dict(headers)["tier"] == b"5s"
        assert sent(provider) == []
        assert rt.durability is not None
        assert await rt.durability.retry_parked("A1:1", 1) == "delivered"
        assert await rt.durability.retry_parked("A1:1", 1) == "stale"
    assert sent(provider) == ["hello"]


async def test_a_chats_flow_is_dropped_and_restarted_through_control() -> None:
    """``botmesh flows drop|restart`` produce ``drop_flow`` / ``restart_flow`` requests keyed
    by the chat: its owner ends the flow (its next message goes to the handlers) or starts
    it again from its first question; a chat without a flow, or a flow ended already, is
    refused with its state."""
    from botmesh import Conversation

    provider, produced = MockProvider(), Produced()
    bot = Bot("flowops", durability={"poll": 0})

    @bot.flow("two", persistent=True)
    async def two(conv: Conversation) -> None:
        first = await conv.ask("first?")
        await conv.ask(f"second, after {first}?")

    @bot.on_message
    async def handler(ctx: Context) -> None:
        if ctx.text == "/start":
            await ctx.start_flow(two)
        else:
            await ctx.reply(f"handler: {ctx.text}")

    async with bot.bind(
        provider, MemoryKv(), instance_id="w", receipts=KafkaReceipts(produced)
    ) as rt:
        runner = runner_of(rt, produced)
        await runner.run_batch([record(0, "A", "A0", "/start"), record(1, "A", "A1", "one")])
        assert sent(provider) == ["first?", "second, after one?"]
        await runner.run_batch(
            [
                control(2, 2.0, "A", "c1", "drop_flow", "A"),
                control(3, 3.0, "A", "c2", "drop_flow", "A"),
                control(4, 4.0, "B", "c3", "restart_flow", "B"),
            ]
        )
        await runner.run_batch([record(5, "A", "A2", "two")])  # the flow is gone
        assert sent(provider)[-1] == "handler: two"
        await runner.run_batch([control(6, 6.0, "A", "c4", "restart_flow", "A")])
        assert rt.durability is not None
        await rt.durability.drain()  # the sweeper runs the restart's start
        assert sent(provider)[-1] == "first?"
        [flow] = await rt.durability.flows("A")
        assert (flow.status, flow.steps) == ("active", 0)
    assert results(produced) == [
        ("done", "dropped", "drop_flow"),
        ("refused", "dropped", "drop_flow"),
        ("refused", None, "restart_flow"),
        ("done", "active", "restart_flow"),
    ]
