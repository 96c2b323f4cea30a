"""The worker's inbound path (``botmesh.streams.runner``) without Kafka: plain records through the
REAL runtime (``bot.bind``) on a journal from the fault kit (``botmesh.testing.crashable``),
which fails or dies for real inside the engine.

The producer is the one stand-in: ``Produced`` keeps what would go to Kafka and acks it at
once. "Acked" below means ``run_batch`` returned: the worker acks a batch only then.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

import botmesh
from botmesh import Bot, Context, Inbound, Outcome, Receipt
from botmesh.errors import BadRecord, JournalUnavailableError, Reason, RecipientUnreachableError
from botmesh.journal import MemoryKv, OutboxState, Write
from botmesh.streams.dead_letter_copies import CUT_MARGIN, record_size, too_large
from botmesh.streams.runner import BatchAbandoned, InboundRunner, RawRecord, in_time_order
from botmesh.streams.sink import KafkaReceipts
from botmesh.testing import MockProvider, SimulatedCrash, crashable
from botmesh.topics.dead_letters import redact
from botmesh.topics.records import SendRequest, decode_receipt, encode_inbound, encode_request
from tests.kafka.record_batch import BATCH_HEADER, crc32c, encode_batch, read_varint, varint

TOPIC = "t.inbound"


@dataclass
class Produced:
    """What the runner hands to the producer, by role; every record is acked at once."""

    records: list[tuple[str, bytes | None, bytes, list[tuple[str, bytes]]]] = field(
        default_factory=list
    )

    async def __call__(
        self, role: str, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]]
    ) -> Awaitable[Any]:
        self.records.append((role, key, value, headers))
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ack.set_result(None)
        return ack

    def dead(self) -> list[dict[str, str]]:
        """The dead letters' headers (decoded), in produce order."""
        return [
            {k: v.decode() for k, v in headers}
            for role, _, _, headers in self.records
            if role == "dlq"
        ]

    def receipts(self) -> list[botmesh.Receipt]:
        return [decode_receipt(value) for role, _, value, _ in self.records if role == "sent"]


class Seen(list[str]):
    """The handler runs, in order; ``await seen.reach(n)`` waits for the n-th."""

    def __init__(self) -> None:
        super().__init__()
        self._grew = asyncio.Event()

    def append(self, item: str) -> None:
        super().append(item)
        self._grew.set()

    async def reach(self, n: int) -> None:
        while len(self) < n:
            self._grew.clear()
            await self._grew.wait()


def make_bot(seen: list[str], **inbox: Any) -> Bot:
    """A bot whose handler records each run in ``seen`` and replies once."""
    inbox.setdefault("backoff", {"base": "10ms", "cap": "40ms", "jitter": 0})
    bot = Bot("runner", durability={"poll": 0, "inbox": inbox})

    @bot.on_message
    async def reply(ctx: Context) -> None:
        seen.append(ctx.inbound_id)
        await ctx.reply(f"re {ctx.text}")

    return bot


class InboundsOnly:
    """A runtime for batches of inbounds only: each test's ``handle``; the rest does
    nothing (no receipts, no requests)."""

    inbox_retries = Bot("x").bind(MockProvider()).inbox_retries
    durability = None

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def flush_receipts(self) -> int:
        return 0

    async def quiesce(self) -> int:
        return 0

    async def send(self, chat_id: str, text: str | None = None, **opts: Any) -> Receipt:
        raise AssertionError("no request in this batch")

    async def delivery_status(self, chat_id: str, message_id: str, status: str, **kw: Any) -> str:
        raise AssertionError("no status in this batch")

    async def edit(self, key: str, text: str, **opts: Any) -> Receipt:
        raise AssertionError("no edit in this batch")

    async def delete(self, key: str, **opts: Any) -> Receipt:
        raise AssertionError("no delete in this batch")


def record(offset: int, chat: str, mid: str | None = None, text: str = "hi") -> RawRecord:
    value = encode_inbound(Inbound(id=mid or "", chat_id=chat, text=text))
    return RawRecord(TOPIC, 0, offset, chat.encode(), value, [("trace", b"t-1")])


async def crashed_with_a1_journaled(seen: list[str]) -> tuple[Bot, MemoryKv]:
    """A bot with ``inbox.max_attempts=1`` (its handler records runs in ``seen``) whose
    process died (a real ``SimulatedCrash`` inside the engine, not an ``Exception``: nothing
    of the batch is acked) right after inbound A1, offset 5 of chat A, was journaled; its
    journal, for the next start."""
    shared = MemoryKv()
    kv = crashable(shared)
    kv.crash_after(Write.INBOX_JOURNAL)
    bot = make_bot(seen, max_attempts=1)
    first = bot.bind(MockProvider(), kv, instance_id="w")
    await first.start()
    with pytest.raises(SimulatedCrash):
        await InboundRunner(first, Produced()).run_batch([record(5, "A", "A1")])
    return bot, shared


class Waits:
    """The runner's sleep between attempts: records each delay (``entered`` is set), then
    waits for ``go``."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self.entered = asyncio.Event()
        self.go = asyncio.Event()
        self.go.set()

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        self.entered.set()
        await self.go.wait()


async def test_a_failing_chat_retries_while_the_other_chats_of_the_batch_are_handled() -> None:
    seen = Seen()
    kv = crashable(MemoryKv())
    produced, waits = Produced(), Waits()
    waits.go.clear()  # A1 waits for its retry until we say so
    async with make_bot(seen).bind(MockProvider(), kv, instance_id="w") as runtime:
        runner = InboundRunner(runtime, produced, sleep=waits)
        kv.fail(Write.INBOX_JOURNAL, times=1)  # the first journal write (A1's) fails
        records = [record(0, "A", "A1"), record(1, "B", "B1"), record(2, "A", "A2")]
        records.append(record(3, "B", "B2"))
        batch = asyncio.ensure_future(runner.run_batch(records))
        await waits.entered.wait()
        await seen.reach(2)
        # chat B was handled while A1 waits for its retry; A2 waits behind A1; nothing acked
        assert seen == ["B1", "B2"]
        assert not batch.done()
        assert waits.delays == [0.01]  # the bot's inbox backoff, attempt 1
        waits.go.set()
        await batch
    assert seen == ["B1", "B2", "A1", "A2"]
    assert runner.outcomes == {Outcome.HANDLED: 4}
    assert runner.retried == 1
    assert produced.dead() == []


async def test_batches_run_side_by_side_and_a_chat_keeps_its_order_across_them() -> None:
    """The worker starts each batch as it is taken: a later batch's chats are handled while
    an earlier batch waits on one chat, whose later records wait for it (in the order the
    batches were handed over); each batch returns (is acked) once its own records settled."""
    seen = Seen()
    kv = crashable(MemoryKv())
    produced, waits = Produced(), Waits()
    waits.go.clear()  # A1 waits for its retry until we say so
    async with make_bot(seen).bind(MockProvider(), kv, instance_id="w") as runtime:
        runner = InboundRunner(runtime, produced, sleep=waits)
        kv.fail(Write.INBOX_JOURNAL, times=1)  # A1's journal write fails once
        first = asyncio.ensure_future(runner.run_batch([record(0, "A", "A1")]))
        await waits.entered.wait()
        second = asyncio.ensure_future(
            runner.run_batch([record(1, "B", "B1"), record(2, "A", "A2"), record(3, "C", "C1")])
        )
        third = asyncio.ensure_future(runner.run_batch([record(4, "B", "B2")]))
        await third  # settled, and so acked, while the first batch still waits
        await seen.reach(3)
        assert sorted(seen) == ["B1", "B2", "C1"]  # A2 waits for A1, in the batch before
        assert not first.done() and not second.done()
        assert runner.unsettled == 2  # A1 and A2
        waits.go.set()
        await asyncio.gather(first, second)
    assert seen.index("A1") < seen.index("A2")
    assert seen.index("B1") < seen.index("B2")
    assert runner.unsettled == 0
    assert runner.outcomes == {Outcome.HANDLED: 5}


async def test_a_record_is_not_acked_before_it_has_an_outcome() -> None:
    """A batch with a record the journal refuses does not return (is not acked) until the
    record was handled on a later attempt; the handlers ran once."""
    seen: list[str] = []
    kv = crashable(MemoryKv())
    produced, waits = Produced(), Waits()
    waits.go.clear()
    async with make_bot(seen).bind(MockProvider(), kv, instance_id="w") as runtime:
        runner = InboundRunner(runtime, produced, sleep=waits)
        kv.down = True
        batch = asyncio.ensure_future(runner.run_batch([record(0, "A", "A1")]))
        await waits.entered.wait()
        assert not batch.done() and seen == []
        kv.down = False
        waits.go.set()
        await batch
    assert seen == ["A1"]
    assert runner.outcomes == {Outcome.HANDLED: 1}


async def test_after_the_inbox_budget_the_record_goes_to_the_dlq_and_the_chat_goes_on() -> None:
    seen: list[str] = []
    kv = crashable(MemoryKv())
    produced, waits = Produced(), Waits()
    async with make_bot(seen, max_attempts=3).bind(MockProvider(), kv, instance_id="w") as rt:
        runner = InboundRunner(rt, produced, sleep=waits)
        kv.fail(Write.INBOX_JOURNAL, times=3)  # A1's three attempts; A2 journals fine
        await runner.run_batch([record(7, "A", "A1"), record(8, "A", "A2")])
    assert seen == ["A2"]
    assert waits.delays == [0.01, 0.02]  # backoff after attempts 1 and 2, then the budget
    [dead] = produced.dead()
    assert dead["reason"] == Reason.JOURNAL_UNAVAILABLE.value == "journal-unavailable"
    assert dead["error.class"] == "JournalUnavailableError"
    assert "journal down" in dead["error.message"]
    assert dead["attempts"] == "3"
    assert (dead["source.topic"], dead["source.partition"], dead["source.offset"]) == (
        TOPIC,
        "0",
        "7",
    )
    assert dead["trace"] == "t-1"  # the record's own headers are kept
    role, key, value, _ = produced.records[0]
    assert (role, key, value) == ("dlq", b"A", record(7, "A", "A1").value)
    assert runner.dead_letters == {Reason.JOURNAL_UNAVAILABLE: 1}
    assert runner.outcomes == {Outcome.HANDLED: 1}


async def test_an_unexpected_error_from_handle_dead_letters_as_handle_failed() -> None:
    """The runtime was never started: ``handle`` raises a ``DurabilityError`` that is not a
    journal outage; after the budget the record goes to the DLQ as ``handle-failed``."""
    seen: list[str] = []
    runtime = make_bot(seen, max_attempts=2).bind(MockProvider(), MemoryKv(), instance_id="w")
    produced, waits = Produced(), Waits()
    await InboundRunner(runtime, produced, sleep=waits).run_batch([record(0, "A", "A1")])
    [dead] = produced.dead()
    assert dead["reason"] == "handle-failed"
    assert dead["error.class"] == "DurabilityError"
    assert "not running" in dead["error.message"]
    assert seen == [] and waits.delays == [0.01]


async def test_undecodable_records_go_to_the_dlq_at_once_and_the_next_one_is_handled() -> None:
    seen: list[str] = []
    produced = Produced()
    bad = [
        (b"{not json", "bad-json"),
        (b'{"v": 1, "text": "no chat"}', "missing-chat-id"),
        (b'{"v": 7, "chat_id": "c"}', "unknown-version"),
        (None, "empty"),
    ]
    records = [RawRecord(TOPIC, 0, i, b"c", v) for i, (v, _) in enumerate(bad)]
    records.append(record(len(bad), "c", "ok"))
    async with make_bot(seen).bind(MockProvider(), MemoryKv(), instance_id="w") as runtime:
        runner = InboundRunner(runtime, produced, sleep=Waits())
        await runner.run_batch(records)
    assert [d["reason"] for d in produced.dead()] == [reason for _, reason in bad]
    assert all(d["error.class"] == "BadRecord" and d["detail"] for d in produced.dead())
    assert seen == ["ok"]
    assert runner.retried == 0


async def test_a_record_without_an_id_is_journaled_under_its_offset() -> None:
    seen: list[str] = []
    async with make_bot(seen).bind(MockProvider(), MemoryKv(), instance_id="w") as runtime:
        runner = InboundRunner(runtime, Produced(), sleep=Waits())
        await runner.run_batch([record(41, "c")])
        await runner.run_batch([record(41, "c")])  # read again there: an offset replay
    # the journal knows it by its offset: the handlers run again, nothing is journaled anew
    assert seen == [f"{TOPIC}:0:41"] * 2
    assert runner.outcomes == {Outcome.HANDLED: 1, Outcome.REPLAYED: 1}


async def test_an_inbound_the_journal_dead_lettered_goes_to_the_dlq_as_attempts_exhausted() -> None:
    """A real crash after the inbound was journaled, with ``inbox.max_attempts=1``: the next
    start dead-letters it in the journal, and its redelivery is the outcome ``dead``."""
    seen: list[str] = []
    bot, shared = await crashed_with_a1_journaled(seen)
    produced = Produced()
    async with bot.bind(MockProvider(), shared, instance_id="w") as second:
        runner = InboundRunner(second, produced, sleep=Waits())
        await runner.run_batch([record(5, "A", "A1")])
    assert runner.outcomes == {Outcome.DEAD: 1}
    [dead] = produced.dead()
    assert dead["reason"] == "attempts-exhausted"
    assert "error.class" not in dead
    assert seen == []


async def test_badrecord_raised_by_handle_goes_to_the_dlq_at_once() -> None:
    """The one path the real engine gives no way to reach from the wire (every decoded
    record can be journaled): a runtime that refuses the record, as the protocol allows."""

    class Refusing(InboundsOnly):
        async def handle(self, message: Inbound, *, source: str | None = None) -> Outcome:
            raise BadRecord(Reason.WRONG_TYPE, f"cannot journal {message.id}")

    produced = Produced()
    runner = InboundRunner(Refusing(), produced, sleep=Waits())
    await runner.run_batch([record(0, "A", "A1")])
    [dead] = produced.dead()
    assert (dead["reason"], dead["detail"], dead["attempts"]) == (
        "wrong-type",
        "cannot journal A1",
        "1",
    )


async def test_an_unconfirmed_membership_waits_uncharged_until_confirmed_or_revoked() -> None:
    """A worker whose group membership is unconfirmed (it was frozen) neither spends the
    record's retry budget nor dead-letters it: it waits for the group."""
    from botmesh.streams.table_kv import MembershipUnconfirmed

    class Thawing(InboundsOnly):
        inbox_retries = (
            Bot("x", durability={"inbox": {"max_attempts": 2}}).bind(MockProvider()).inbox_retries
        )
        refusals = 5

        async def handle(self, message: Inbound, *, source: str | None = None) -> Outcome:
            if self.refusals:
                self.refusals -= 1
                try:
                    raise MembershipUnconfirmed("membership last confirmed 20s ago")
                except MembershipUnconfirmed as exc:  # as the engine wraps a failed done
                    raise JournalUnavailableError("handled but not marked done") from exc
            return Outcome.HANDLED

    produced, waits = Produced(), Waits()
    runtime = Thawing()
    runner = InboundRunner(runtime, produced, sleep=waits)
    await runner.run_batch([record(0, "A", "A1")])
    assert (runner.outcomes, produced.dead(), runtime.refusals) == ({Outcome.HANDLED: 1}, [], 0)
    assert waits.delays == [0.5] * 5
    runtime.refusals = 1
    runner = InboundRunner(runtime, produced, sleep=Waits(), owns=lambda p: False)
    with pytest.raises(BatchAbandoned, match="taken from this worker"):
        await runner.run_batch([record(1, "A", "A2")])
    runtime.refusals = 100  # never confirmed: evicted; the batch is given up after 5 s
    runner = InboundRunner(runtime, produced, sleep=waits)
    with pytest.raises(BatchAbandoned, match="membership stays unconfirmed"):
        await runner.run_batch([record(2, "A", "A3")])
    assert produced.dead() == [] and len(waits.delays) == 5 + 10


async def test_deferred_writes_refused_for_an_unconfirmed_membership_wait_then_give_up() -> None:
    """The batch's flush of the journal's deferred writes, refused because the worker's
    membership is unconfirmed (it was frozen), waits as a record would: confirmed within
    5 s, the batch is settled; never confirmed (evicted), the batch is given up, so the
    worker exits and rejoins instead of holding up the group's rebalance until the deadline."""
    from botmesh.streams.table_kv import MembershipUnconfirmed

    refusals = 3

    async def flush() -> None:
        nonlocal refusals
        if refusals:
            refusals -= 1
            raise MembershipUnconfirmed("membership last confirmed 20s ago")

    seen = Seen()
    async with make_bot(seen).bind(MockProvider(), MemoryKv(), instance_id="w") as runtime:
        waits = Waits()
        runner = InboundRunner(runtime, Produced(), sleep=waits, flush=flush)
        await runner.run_batch([record(0, "A", "A1")])
        assert (seen, refusals, waits.delays) == (["A1"], 0, [0.5] * 3)
        refusals = 100
        runner = InboundRunner(runtime, Produced(), sleep=Waits(), flush=flush)
        with pytest.raises(BatchAbandoned, match="membership stays unconfirmed"):
            await runner.run_batch([record(1, "A", "A2")])
        assert refusals == 100 - 11


async def test_a_write_fenced_by_a_newer_producer_gives_the_batch_up_at_once() -> None:
    """Under exactly_once a fenced transaction means another worker owns the partition: the
    record is neither retried nor dead-lettered, and nothing of the batch is acked."""
    from botmesh.streams.table_kv import ProducerFencedOut

    class Fenced(InboundsOnly):
        calls = 0

        async def handle(self, message: Inbound, *, source: str | None = None) -> Outcome:
            self.calls += 1
            try:
                raise ProducerFencedOut("transaction t.worker-1-0 not committed: ProducerFenced")
            except ProducerFencedOut as exc:  # as the engine wraps a failed journal write
                raise JournalUnavailableError("inbound not journaled") from exc

    produced, waits, runtime = Produced(), Waits(), Fenced()
    runner = InboundRunner(runtime, produced, sleep=waits)
    with pytest.raises(BatchAbandoned, match="another worker owns its partition"):
        await runner.run_batch([record(0, "A", "A1"), record(1, "A", "A2")])
    assert (runtime.calls, waits.delays, produced.dead()) == (1, [], [])


async def test_a_stop_while_a_record_waits_for_a_retry_abandons_the_batch() -> None:
    kv = crashable(MemoryKv())
    async with make_bot([]).bind(MockProvider(), kv, instance_id="w") as runtime:
        runner = InboundRunner(runtime, Produced())  # the real, stop-aware wait
        runner.stopping.set()
        kv.down = True
        with pytest.raises(BatchAbandoned, match="stopping"):
            await runner.run_batch([record(0, "A", "A1")])
        kv.down = False


async def test_a_retry_past_the_batch_deadline_abandons_the_batch() -> None:
    kv = crashable(MemoryKv())
    async with make_bot([]).bind(MockProvider(), kv, instance_id="w") as runtime:
        runner = InboundRunner(runtime, Produced(), batch_deadline=0.0, sleep=Waits())
        kv.down = True
        with pytest.raises(BatchAbandoned, match="retried for 0s"):
            await runner.run_batch([record(0, "A", "A1"), record(1, "B", "B1")])
        kv.down = False


async def test_receipts_go_to_the_sink_and_are_recorded_published_at_the_end_of_the_batch() -> None:
    seen: list[str] = []
    produced = Produced()
    kv = MemoryKv()
    bot = make_bot(seen)
    async with bot.bind(
        MockProvider(), kv, instance_id="w", receipts=KafkaReceipts(produced)
    ) as runtime:
        runner = InboundRunner(runtime, produced, sleep=Waits())
        await runner.run_batch([record(i, f"c{i % 3}", f"m{i}") for i in range(9)])
        journal = await kv.scan(f"{bot.scope}/out/")
    receipts = produced.receipts()
    assert sorted(r.key for r in receipts) == sorted(f"m{i}:1" for i in range(9))
    assert {r.state for r in receipts} == {OutboxState.SENT}
    keys = {role: key for role, key, _, _ in produced.records}
    assert keys == {"sent": b"c2"}  # the last; every receipt is keyed by its chat id
    assert len(journal) == 9
    assert all(e.value["published"] is True for e in journal)


def test_credentials_in_urls_never_reach_a_dead_letter() -> None:
    text = "cannot reach postgresql://bot:s3cret@db:5432/journal (timeout)"
    assert redact(text) == "cannot reach postgresql://***@db:5432/journal (timeout)"


async def test_the_echo_bot_and_the_test_bot_run_in_process_unchanged(tmp_path: Path) -> None:
    """The modules ``botmesh worker --app`` runs are plain definitions: ``botmesh.run``
    runs them in this process, on a file journal, without an edit."""
    from botmesh.examples.echo_bot import bot as echo
    from tests.kafka.bot import FileProvider
    from tests.kafka.bot import bot as test_bot

    provider = MockProvider()
    async with botmesh.run(echo, provider, journal=f"file://{tmp_path}/echo") as app:
        assert await app.handle(Inbound(id="m1", chat_id="42", text="hi")) == Outcome.HANDLED
    assert [m.text for m in provider.sent] == ["echo: hi"]

    sends = tmp_path / "sends.jsonl"
    async with botmesh.run(test_bot, FileProvider(str(sends)), journal="memory://") as app:
        assert await app.handle(Inbound(id="m2", chat_id="42", text="yo")) == Outcome.HANDLED
    assert '"text": "echo m2: yo"' in sends.read_text()


# -- send requests (<prefix>.requests) -----------------------------------------------------

REQUESTS = "t.requests"


def request(offset: int, ts: float, chat: str, rid: str, text: str, **more: Any) -> RawRecord:
    value = encode_request(SendRequest(id=rid, chat_id=chat, text=text, **more))
    return RawRecord(REQUESTS, 0, offset, chat.encode(), value, [("trace", b"r-1")], ts)


def timed(offset: int, ts: float, chat: str, mid: str, text: str = "hi") -> RawRecord:
    return dataclasses.replace(record(offset, chat, mid, text), timestamp=ts)


async def test_requests_are_sent_in_time_order_with_the_chats_replies() -> None:
    """One batch, as the consumer hands it over (inbound records first, then the requests):
    each chat's records are settled in producer-time order, each topic in offset order."""
    seen: list[str] = []
    provider, produced = MockProvider(), Produced()
    bot = make_bot(seen)
    async with bot.bind(
        provider, MemoryKv(), instance_id="w", receipts=KafkaReceipts(produced)
    ) as rt:
        runner = InboundRunner(rt, produced, sleep=Waits(), requests_topic=REQUESTS)
        batch = [
            timed(0, 1.0, "A", "A1", "one"),
            timed(1, 3.0, "A", "A2", "three"),
            timed(2, 2.0, "B", "B1", "b"),
            request(0, 2.0, "A", "r1", "two"),
            request(1, 4.0, "A", "r2", "four"),
            request(2, 1.0, "B", "rb", "first in B", key="nudge:B"),
        ]
        await runner.run_batch(batch)
    texts = [(m.chat_id, m.text) for m in provider.sent]
    assert [t for c, t in texts if c == "A"] == ["re one", "two", "re three", "four"]
    assert [t for c, t in texts if c == "B"] == ["first in B", "re b"]
    assert runner.requests == {"sent": 3}
    assert runner.outcomes == {Outcome.HANDLED: 3}
    keys = {r.key for r in produced.receipts() if r.inbound_id is None}
    assert keys == {"req:r1", "req:r2", "nudge:B"}


async def test_a_request_delivered_again_sends_nothing_twice() -> None:
    provider, kv = MockProvider(), MemoryKv()
    async with make_bot([]).bind(provider, kv, instance_id="w") as rt:
        runner = InboundRunner(rt, Produced(), sleep=Waits(), requests_topic=REQUESTS)
        twice = [request(0, 1.0, "A", "r1", "hello"), request(1, 2.0, "A", "r1", "hello")]
        await runner.run_batch(twice)
        await runner.run_batch([request(0, 1.0, "A", "r1", "hello")])  # redelivered
        deduped = rt.metrics()["outboxDeduped"]
    assert [m.text for m in provider.sent] == ["hello"]
    assert runner.requests == {"sent": 3}  # the copies answered from the outbox
    assert deduped == 2


async def test_a_malformed_request_goes_to_the_requests_dlq_and_the_chat_goes_on() -> None:
    provider, produced = MockProvider(), Produced()
    async with make_bot([]).bind(provider, MemoryKv(), instance_id="w") as rt:
        runner = InboundRunner(rt, produced, sleep=Waits(), requests_topic=REQUESTS)
        bad = RawRecord(REQUESTS, 3, 9, b"A", b'{"v": 1, "chat_id": "A", "text": "x"}')
        await runner.run_batch([bad, request(10, 2.0, "A", "r2", "after")])
    assert [m.text for m in provider.sent] == ["after"]
    [(role, key, value, headers)] = [r for r in produced.records if r[0] != "sent"]
    assert (role, key, value) == ("requests-dlq", b"A", bad.value)
    dead = {k: v.decode() for k, v in headers}
    assert dead["reason"] == "wrong-type"
    assert "field 'id' is required" in dead["detail"]
    assert dead["error.class"] == "BadRecord"
    assert (dead["source.topic"], dead["source.partition"], dead["source.offset"]) == (
        REQUESTS,
        "3",
        "9",
    )
    assert produced.dead() == []  # nothing on the inbound DLQ
    assert runner.dead_letters == {Reason.WRONG_TYPE: 1}


async def test_a_request_the_journal_refuses_is_retried_then_dead_lettered() -> None:
    kv = crashable(MemoryKv())
    provider, produced, waits = MockProvider(), Produced(), Waits()
    async with make_bot([], max_attempts=2).bind(provider, kv, instance_id="w") as rt:
        runner = InboundRunner(rt, produced, sleep=waits, requests_topic=REQUESTS)
        kv.fail(Write.OUTBOX_JOURNAL, times=1)  # r1's first attempt; its retry journals
        await runner.run_batch([request(0, 1.0, "A", "r1", "one")])
        kv.fail(Write.OUTBOX_JOURNAL, times=2)  # r2: both attempts
        await runner.run_batch([request(1, 2.0, "A", "r2", "two")])
    assert [m.text for m in provider.sent] == ["one"]
    assert waits.delays == [0.01, 0.01]
    assert runner.requests == {"sent": 1} and runner.retried == 2
    [(role, _, _, headers)] = [r for r in produced.records if r[0] != "sent"]
    dead = {k: v.decode() for k, v in headers}
    assert role == "requests-dlq"
    assert (dead["reason"], dead["attempts"]) == ("journal-unavailable", "2")
    assert dead["error.class"] == "JournalUnavailableError"


async def test_a_request_the_provider_refuses_is_settled_dead_and_its_send_dead_lettered() -> None:
    """The request itself is settled (not on ``requests.dlq``); its send is dead in the
    journal, so its copy goes to ``outbox.dlq`` once, with the headers of the dead send."""
    provider, produced = MockProvider(), Produced()
    provider.fail_next(RecipientUnreachableError("blocked the bot"))
    bot = make_bot([])
    async with bot.bind(
        provider, MemoryKv(), instance_id="w", receipts=KafkaReceipts(produced)
    ) as rt:
        runner = InboundRunner(rt, produced, sleep=Waits(), requests_topic=REQUESTS)
        await runner.run_batch([request(0, 1.0, "A", "r1", "x"), request(1, 2.0, "A", "r1", "x")])
    assert runner.requests == {"refused": 1, "dead": 1}  # the copy: answered from the outbox
    # the copy's answer publishes the receipt again (receipts are at least once, by key)
    assert [(r.key, r.state) for r in produced.receipts()] == [("req:r1", OutboxState.DEAD)] * 2
    [(role, key, value, headers)] = [r for r in produced.records if r[0] != "sent"]
    dead = {k: v.decode() for k, v in headers}
    assert (role, key) == ("outbox-dlq", b"A")
    assert json.loads(value) == {"v": 1, "key": "req:r1", "chat_id": "A", "text": "x"}
    assert (dead["reason"], dead["idempotency.key"], dead["chat.id"]) == (
        "send-refused",
        "req:r1",
        "A",
    )
    assert (dead["error.class"], dead["error.message"]) == (
        "RecipientUnreachableError",
        "blocked the bot",
    )
    assert dead["attempts"] == "1" and float(dead["failed.first"]) <= float(dead["failed.last"])


def test_time_order_merges_topics_and_keeps_each_partitions_order() -> None:
    """Timestamps out of order within one partition (two producers' clocks) are not sorted:
    only how the two sequences interleave follows the timestamps."""
    a1, a2 = timed(0, 5.0, "A", "a1"), timed(1, 1.0, "A", "a2")  # a2 stamped earlier
    r1, r2 = request(0, 2.0, "A", "r1", "x"), request(1, 6.0, "A", "r2", "y")
    items: list[Any] = [(raw, None) for raw in (a1, a2, r1, r2)]
    assert [raw for raw, _ in in_time_order(items)] == [r1, a1, a2, r2]
    untimed: list[Any] = [(record(0, "A", "a"), None), (r1, None)]
    assert in_time_order(untimed) == untimed  # no timestamp: as they came


def test_the_worker_refuses_a_requests_topic_partitioned_unlike_the_inbound() -> None:
    from botmesh.state.errors import ConfigError
    from botmesh.streams.provision import check_copartitioned
    from botmesh.topics import Catalog

    cat = Catalog("p")
    check_copartitioned(cat, {"p.inbound": 4, "p.requests": 4})
    check_copartitioned(cat, {"p.inbound": 4})  # no requests topic: nothing to refuse
    with pytest.raises(ConfigError, match=r"p\.requests has 8 partitions but p\.inbound has 4"):
        check_copartitioned(cat, {"p.inbound": 4, "p.requests": 8})
    with pytest.raises(ConfigError, match=r"p\.control has 2 partitions but p\.inbound has 4"):
        check_copartitioned(cat, {"p.inbound": 4, "p.control": 2})


# -- records too large to copy ---------------------------------------------------------------

#: The largest value the broker's default ``max.message.bytes`` (1,048,588) takes with a
#: one-byte key and no headers: undecodable, it must still reach the DLQ.
HUGE = 1_048_500


def refusal() -> Exception:
    """The error librdkafka raises for a record too large (its check before sending, and a
    broker's refusal in the delivery report)."""
    return KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))


@dataclass
class Limited(Produced):
    """A producer that checks sizes as the worker's does: ``limit`` as librdkafka's
    ``message.max.bytes`` (refused before sending),
    ``topic_limit`` as the DLQ topic's ``max.message.bytes`` (the broker refuses it: the
    ack fails). ``records`` holds only what was accepted."""

    limit: int = 1_000_000
    topic_limit: int | None = None
    refused: list[int] = field(default_factory=list)

    async def __call__(
        self, role: str, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]]
    ) -> Awaitable[Any]:
        size = record_size(key, value, headers)
        if size > self.limit:
            self.refused.append(size)
            raise refusal()
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.topic_limit is not None and size > self.topic_limit:
            self.refused.append(size)
            ack.set_exception(refusal())
            return ack
        self.records.append((role, key, value, headers))
        ack.set_result(None)
        return ack


def dlq_records(produced: Produced) -> list[tuple[bytes | None, bytes, dict[str, str]]]:
    return [
        (key, value, {k: v.decode(errors="replace") for k, v in headers})
        for role, key, value, headers in produced.records
        if role == "dlq"
    ]


async def test_a_record_too_large_to_copy_goes_to_the_dlq_cut_and_the_chat_goes_on() -> None:
    """A value the broker took (1,048,500 bytes) is too large for the producer once the
    dead letter's headers are on it: it goes cut, saying so, and the next record of the
    chat is handled (before, the batch was abandoned at every start)."""
    seen: list[str] = []
    produced = Limited()
    huge = b"\xff" + bytes(range(256)) * (HUGE // 256) + b"!" * (HUGE % 256 - 1)
    assert len(huge) == HUGE
    big = RawRecord(TOPIC, 0, 5, b"A", huge, [("trace", b"t-1")])
    async with make_bot(seen).bind(MockProvider(), MemoryKv(), instance_id="w") as runtime:
        runner = InboundRunner(runtime, produced, sleep=Waits())
        await runner.run_batch([big, record(6, "A", "A2")])
    assert seen == ["A2"]
    [(key, value, dead)] = dlq_records(produced)
    assert dead["reason"] == "bad-json"
    assert (dead["truncated"], dead["original.size"]) == ("true", str(HUGE))
    assert (dead["source.topic"], dead["source.partition"], dead["source.offset"]) == (
        TOPIC,
        "0",
        "5",
    )
    assert dead["trace"] == "t-1" and "headers.dropped" not in dead
    assert key == b"A" and value == huge[: len(value)]
    size = record_size(key, value, produced.records[0][3])
    assert 1_000_000 - 2 * CUT_MARGIN < size <= 1_000_000 - CUT_MARGIN
    assert produced.refused == []  # cut before it was produced, not after a refusal
    assert runner.cut == 1 and runner.dead_letters == {Reason.BAD_JSON: 1}


async def test_a_dead_letter_that_fits_goes_whole_under_the_limit_given() -> None:
    produced = Limited(limit=50_000)
    small = RawRecord(TOPIC, 0, 0, b"A", b"x" * 20_000)
    large = RawRecord(TOPIC, 0, 1, b"A", b"y" * 60_000)
    async with make_bot([]).bind(MockProvider(), MemoryKv(), instance_id="w") as runtime:
        runner = InboundRunner(runtime, produced, sleep=Waits(), max_request_size=50_000)
        await runner.run_batch([small, large])
    [(_, whole, first), (_, cut, second)] = dlq_records(produced)
    assert whole == small.value and "truncated" not in first and "original.size" not in first
    assert (second["truncated"], second["original.size"]) == ("true", "60000")
    assert 0 < len(cut) < 50_000 - CUT_MARGIN and cut == b"y" * len(cut)
    assert runner.cut == 1


async def test_a_producer_that_refuses_a_dead_letter_as_too_large_gets_it_cut() -> None:
    """The runner's limit above the producer's (a misconfiguration): the producer refuses
    the whole copy, the cut copy goes out instead of the batch being abandoned."""
    produced = Limited(limit=200_000)
    raw = RawRecord(TOPIC, 0, 3, b"A", b"z" * 300_000)
    async with make_bot([]).bind(MockProvider(), MemoryKv(), instance_id="w") as runtime:
        runner = InboundRunner(runtime, produced, sleep=Waits())  # believes 1,000,000
        await runner.run_batch([raw, record(4, "A", "A2")])
    assert len(produced.refused) == 1
    [(_, value, dead)] = dlq_records(produced)
    assert (dead["truncated"], dead["original.size"], dead["source.offset"]) == (
        "true",
        "300000",
        "3",
    )
    assert 0 < len(value) <= (1_000_000 - CUT_MARGIN) // 16 and runner.cut == 1


async def test_a_dead_letter_the_broker_refuses_as_too_large_is_produced_again_cut() -> None:
    """The DLQ topic's ``max.message.bytes`` is under the producer's limit: the broker
    refuses the copy (its ack fails), the runner produces it again cut smaller, then with
    its headers alone, and the batch settles once that one is acked."""
    produced = Limited(topic_limit=70_000)
    mid = RawRecord(TOPIC, 0, 0, b"A", b"m" * 100_000)
    tiny_topic = Limited(topic_limit=5_000)
    async with make_bot([]).bind(MockProvider(), MemoryKv(), instance_id="w") as runtime:
        runner = InboundRunner(runtime, produced, sleep=Waits())
        await runner.run_batch([mid])
        second = InboundRunner(runtime, tiny_topic, sleep=Waits())
        await second.run_batch([mid])
    [(_, value, dead)] = dlq_records(produced)
    assert len(produced.refused) == 1  # the whole copy
    assert (dead["truncated"], dead["original.size"]) == ("true", "100000")
    assert 0 < len(value) <= (1_000_000 - CUT_MARGIN) // 16
    [(_, value, dead)] = dlq_records(tiny_topic)
    assert len(tiny_topic.refused) == 2  # whole, then cut to a sixteenth
    assert value == b"" and dead["truncated"] == "true" and dead["source.offset"] == "0"


async def test_records_of_any_shape_reach_the_dlq_and_the_chat_goes_on() -> None:
    """A huge key, a huge header of the record's own, no key, no value, binary garbage:
    each dead letter fits under the producer's limit and the next message is handled."""
    seen: list[str] = []
    produced = Limited()
    shapes = [
        RawRecord(TOPIC, 0, 0, b"k" * 2_000_000, b"{"),
        RawRecord(TOPIC, 0, 1, b"A", b"{", [("big", b"h" * 1_500_000), ("small", b"s")]),
        RawRecord(TOPIC, 0, 2, None, None),
        RawRecord(TOPIC, 0, 3, b"A", b""),
        RawRecord(TOPIC, 0, 4, b"\x00\xff", bytes(range(256)) * 10, [("\x00", b"\xff")]),
        # a header key that was not UTF-8, as the worker's consumer reads it (escaped)
        RawRecord(TOPIC, 0, 5, b"A", b"{", [(b"k\xff".decode(errors="surrogateescape"), b"v")]),
    ]
    async with make_bot(seen).bind(MockProvider(), MemoryKv(), instance_id="w") as runtime:
        runner = InboundRunner(runtime, produced, sleep=Waits())
        await runner.run_batch([*shapes, record(6, "A", "A2")])
    assert seen == ["A2"] and produced.refused == []
    dead = dlq_records(produced)
    assert [d["source.offset"] for _, _, d in dead] == ["0", "1", "2", "3", "4", "5"]
    assert dead.pop()[2]["k\ufffd"] == "v"
    (key, _, first), (_, _, second) = dead[0], dead[1]
    assert first["original.key.size"] == "2000000" and key == b"k" * len(key or b"")
    assert second["headers.dropped"] == "1" and second["small"] == "s" and "big" not in second
    assert [(k, v) for k, v, _ in dead[2:]] == [
        (None, b""),
        (b"A", b""),
        (b"\x00\xff", bytes(range(256)) * 10),
    ]
    assert all("truncated" not in d for _, _, d in dead[2:])
    assert runner.cut == 2


async def test_a_record_too_large_to_journal_goes_to_the_dlq_at_once() -> None:
    """The journal refuses a record as too large for the producer (librdkafka's error):
    trying again cannot help, so the record goes to the DLQ at once (reason
    ``too-large``), not after the inbox budget."""

    class Journal(InboundsOnly):
        inbox_retries = make_bot([], max_attempts=5).bind(MockProvider()).inbox_retries

        async def handle(self, message: Inbound, *, source: str | None = None) -> Outcome:
            if message.id == "ok":
                return Outcome.HANDLED
            try:
                raise refusal()
            except Exception as exc:
                raise JournalUnavailableError(f"journal write of {message.id} failed") from exc

    produced, waits = Produced(), Waits()
    runner = InboundRunner(Journal(), produced, sleep=waits)
    await runner.run_batch([record(0, "A", "big"), record(1, "A", "ok")])
    [dead] = produced.dead()
    assert (dead["reason"], dead["attempts"]) == ("too-large", "1")
    assert dead["error.class"] == "JournalUnavailableError"
    cause = "KafkaException"
    assert "too large" in dead["detail"] and cause in dead["detail"]
    assert waits.delays == [] and runner.retried == 0
    assert runner.outcomes == {Outcome.HANDLED: 1}


async def test_records_the_decoder_chokes_on_go_to_the_dlq_and_the_chat_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """JSON nested too deeply (the decoder's ``RecursionError`` left the worker before), and
    a decoder that raises something else than ``BadRecord``: each record goes to the DLQ at
    once and the next message of the chat is handled."""
    import botmesh.streams.runner
    from botmesh.topics.records import decode_inbound

    def choking(raw: bytes | str | None) -> Inbound:
        if raw == b"{choke}":
            raise MemoryError("the decoder choked")
        return decode_inbound(raw)

    monkeypatch.setattr(botmesh.streams.runner, "decode_inbound", choking)
    seen: list[str] = []
    produced = Produced()
    deep = b'{"v": 1, "chat_id": "A", "data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    records = [RawRecord(TOPIC, 0, 0, b"A", deep), RawRecord(TOPIC, 0, 1, b"A", b"{choke}")]
    async with make_bot(seen).bind(MockProvider(), MemoryKv(), instance_id="w") as runtime:
        runner = InboundRunner(runtime, produced, sleep=Waits())
        await runner.run_batch([*records, record(2, "A", "A2")])
    assert seen == ["A2"]
    first, second = produced.dead()
    assert (first["reason"], first["source.offset"]) == ("bad-json", "0")
    assert "nested too deeply" in first["detail"]
    assert (second["reason"], second["error.class"]) == ("handle-failed", "MemoryError")
    assert "decoding the record raised MemoryError" in second["detail"]
    assert [r[2] for r in produced.records if r[0] == "dlq"] == [deep, b"{choke}"]


class SlowProduced(Produced):
    """A producer whose send takes a turn of the loop."""

    async def __call__(
        self, role: str, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]]
    ) -> Awaitable[Any]:
        await asyncio.sleep(0.01)
        return await super().__call__(role, key, value, headers)


async def test_a_chat_keeps_its_order_across_batches_when_one_dead_letters_a_record_first() -> None:
    """A batch that dead-letters an undecodable record waits for the producer; a batch
    handed over after it must not take its chats' places meanwhile."""
    seen = Seen()
    async with make_bot(seen).bind(MockProvider(), MemoryKv(), instance_id="w") as runtime:
        runner = InboundRunner(runtime, SlowProduced())
        junk = RawRecord(TOPIC, 0, 0, b"A", b"{not json", [])
        first = asyncio.ensure_future(runner.run_batch([junk, record(1, "A", "A1")]))
        await asyncio.sleep(0)  # the first batch is at its dead letter
        second = asyncio.ensure_future(runner.run_batch([record(2, "A", "A2")]))
        await asyncio.gather(first, second)
    assert seen == ["A1", "A2"]


# -- the size of a record, and the refusals of one too large ----------------------------------

_SIZES = [None, 0, 1, 63, 64, 8191, 8192, 1_048_575, 1_048_576, 2_000_000]
_HEADERS: list[list[tuple[str, bytes]]] = [
    [],
    [("a", b"")],
    [("k" * 64, b"v" * 200), ("é", b"x" * 8192), ("big", b"h" * 300_000)],
    [(f"h{i}", b"y" * i) for i in range(130)],
]


#: What :func:`record_size` reserves above a record alone in its batch: its timestampDelta
#: (a varlong, 10 bytes at its longest; 0 there, 1 byte) and offsetDelta (a varint, 5; 0
#: there, 1 byte) at their longest, 9 + 4 bytes, and its length's varint at its longest (5
#: bytes) where the record's takes 1 to 5: 13 to 17 bytes in all.
SLACK = 9 + 4 + 4


@pytest.mark.parametrize("headers", _HEADERS, ids=["none", "empty", "large", "many"])
def test_record_size_bounds_the_record_batch_it_is_alone_in(
    headers: list[tuple[str, bytes]],
) -> None:
    """What the runner counts is the size of Kafka's record batch v2 holding that record
    alone (``tests/kafka/record_batch.py``, written from the protocol guide), plus what the
    count reserves for the varints that depend on the batch (``SLACK``): never less than the
    batch, for keys and values of every varint length (and none)."""
    named = [(name.encode(), data) for name, data in headers]
    for k in _SIZES:
        for v in _SIZES:
            key = None if k is None else b"k" * k
            value = None if v is None else b"v" * v
            # the CRC's value takes 4 bytes whatever it is: not computed over megabytes here
            batch = encode_batch([(key, value, named)], crc=lambda _: 0)
            size = record_size(key, value, headers)
            assert len(batch) <= size <= len(batch) + SLACK, (k, v)
            # exactly: the record's length varint takes ``width`` bytes of the 5 reserved
            length, body = read_varint(batch, BATCH_HEADER)
            assert body + length == len(batch), (k, v)  # the record fills the batch
            width = body - BATCH_HEADER
            assert size - len(batch) == 9 + 4 + (5 - width), (k, v)


def test_the_record_batch_reference_has_kafka_s_checksum_and_varints() -> None:
    """``tests/kafka/record_batch.py``'s CRC-32C (the check value of the Castagnoli CRC) and
    zigzag varints (the protocol guide's), which the broker judges in ``test_worker``."""
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0
    assert [varint(n) for n in (0, -1, 1, -64, 63, 64, 8191, 8192)] == [
        b"\x00",
        b"\x01",
        b"\x02",
        b"\x7f",
        b"\x7e",
        b"\x80\x01",
        b"\xfe\x7f",
        b"\x80\x80\x01",
    ]
    assert [read_varint(varint(n), 0) for n in (0, -1, 8192, -(2**63))] == [
        (0, 1),
        (-1, 1),
        (8192, 3),
        (-(2**63), 10),
    ]
    assert len(encode_batch([(None, None, [])])) == BATCH_HEADER + 1 + 6


@pytest.mark.parametrize("headers", _HEADERS[:2] + _HEADERS[3:], ids=["none", "empty", "many"])
def test_librdkafka_takes_a_record_as_large_as_its_limit_by_our_count(
    headers: list[tuple[str, bytes]],
) -> None:
    """librdkafka counts a record smaller than :func:`record_size`: a record of exactly
    ``message.max.bytes`` by our count is taken; one far over is refused with the error
    :func:`too_large` knows (its check is in ``produce``, no broker needed)."""
    limit = 100_000
    producer = Producer(
        {"bootstrap.servers": "127.0.0.1:9", "message.max.bytes": limit, "log_level": 0}
    )
    try:
        for key in (None, b"A", b"k" * 5_000):
            room = limit - record_size(key, b"", headers)
            value = b"v" * room
            while record_size(key, value, headers) > limit:  # the value's length varint
                value = value[:-1]
            assert record_size(key, value, headers) == limit or len(value) < room
            producer.produce("t.dlq", value, key, headers=headers)  # type: ignore[arg-type]
            with pytest.raises(KafkaException) as refused:
                producer.produce("t.dlq", value + b"v" * 200, key, headers=headers)  # type: ignore[arg-type]
            assert too_large(refused.value) is refused.value
    finally:
        producer.purge()
        producer.flush(0)


def test_too_large_knows_librdkafkas_refusals_through_their_causes() -> None:
    """librdkafka's refusals by their code, found through what they were raised from; any
    other error is not a size refusal."""

    def wrapped(exc: BaseException) -> BaseException:
        try:
            try:
                raise exc
            except BaseException as inner:
                raise JournalUnavailableError("journal write failed") from inner
        except JournalUnavailableError as outer:
            return outer

    sized: list[BaseException] = [
        KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)),
        KafkaException(KafkaError(KafkaError.RECORD_LIST_TOO_LARGE)),
    ]
    for exc in sized:
        assert too_large(exc) is exc
        assert too_large(wrapped(exc)) is exc
    others: list[BaseException] = [
        KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT)),
        KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)),
        KafkaException(KafkaError(KafkaError.INVALID_MSG_SIZE)),
        KafkaException("no KafkaError in it"),
        ValueError("MessageSizeTooLargeError"),
    ]
    for exc in others:
        assert too_large(exc) is None and too_large(wrapped(exc)) is None
