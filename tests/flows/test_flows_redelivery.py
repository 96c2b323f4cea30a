"""A done message delivered again from where it was read (a Kafka offset replay after a
worker was killed) while its chat's flow waits: it runs as it ran the first time (the
handlers get it again, or the flow finds it among its steps), it is not taken as the answer
to the pending question."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from botmesh import Inbound, Outcome
from botmesh.journal import MemoryKv
from botmesh.state.kv import Op
from botmesh.state.writes import Write
from botmesh.testing import MockProvider
from tests.flows.kit import QUESTIONS, Chat, five_bot, start_app
from tests.kit import texts


async def test_the_start_message_replayed_is_not_an_answer() -> None:
    channel = MockProvider()
    bot, seen = five_bot()
    app = await start_app(bot, provider=channel)
    try:
        said = [("m0", "/start"), ("m1", "a1"), ("m2", "a2")]
        messages = [Inbound(id=i, chat_id="c", text=t) for i, t in said]
        for n, m in enumerate(messages):
            assert await app.runtime.handle(m, source=f"in:0:{n}") == Outcome.HANDLED
        # the worker died before its offsets were committed: all three come again
        for n, m in enumerate(messages):
            assert await app.runtime.handle(m, source=f"in:0:{n}") == Outcome.REPLAYED
        for n, text in enumerate(["a3", "a4", "a5"], start=3):
            message = Inbound(id=f"m{n}", chat_id="c", text=text)
            assert await app.runtime.handle(message, source=f"in:0:{n}") == Outcome.HANDLED
        sent = Counter(m.text for m in channel.sent)
        assert sent == Counter([*QUESTIONS, "thanks a1,a2,a3,a4,a5"])
        [ended] = seen.ended
        assert (ended.status, ended.result) == ("done", ["a1", "a2", "a3", "a4", "a5"])
        assert seen.handled == ["/start", "/start"]  # its handler ran again, nothing new
    finally:
        await app.stop()


async def test_a_message_the_handlers_had_replayed_is_not_an_answer() -> None:
    channel = MockProvider()
    bot, seen = five_bot()
    app = await start_app(bot, provider=channel)
    try:
        said = [("m0", "hi"), ("m1", "/start"), ("m2", "a1")]
        messages = [Inbound(id=i, chat_id="c", text=t) for i, t in said]
        for n, m in enumerate(messages):
            assert await app.runtime.handle(m, source=f"in:0:{n}") == Outcome.HANDLED
        for n, m in enumerate(messages):  # replayed from the offset of "hi" on
            assert await app.runtime.handle(m, source=f"in:0:{n}") == Outcome.REPLAYED
        for n, text in enumerate(["a2", "a3", "a4", "a5"], start=3):
            message = Inbound(id=f"m{n}", chat_id="c", text=text)
            assert await app.runtime.handle(message, source=f"in:0:{n}") == Outcome.HANDLED
        sent = Counter(m.text for m in channel.sent)
        assert sent == Counter(["echo hi", *QUESTIONS, "thanks a1,a2,a3,a4,a5"])
        [ended] = seen.ended
        assert (ended.status, ended.result) == ("done", ["a1", "a2", "a3", "a4", "a5"])
        assert seen.handled == ["hi", "/start", "hi", "/start"]
    finally:
        await app.stop()


class _LosesADone(MemoryKv):
    """A journal that, once, keeps a commit's other writes and loses the write that marks
    inbound ``lose`` done: what a kill between the two records of that commit leaves on
    the Kafka journal (the flow's checkpoint and the inbound are records of their own)."""

    def __init__(self, lose: str) -> None:
        super().__init__()
        self.lose = lose
        self.lost: list[str] = []

    async def commit(self, ops: Sequence[Op], *, label: str = "") -> list[int]:
        kept = [op for op in ops if not op.key.endswith(f"/in/{self.lose}")]
        if self.lost or label != Write.INBOX_MARK_DONE or len(kept) == len(ops):
            return await super().commit(ops, label=label)
        self.lost = [op.key for op in ops if op not in kept]
        versions = iter(await super().commit(kept, label=label))
        return [next(versions) if op in kept else 0 for op in ops]


async def test_a_start_message_whose_done_mark_was_lost_is_not_an_answer() -> None:
    """The start message's flow checkpoint is durable, its done mark is not: the next
    worker runs it again (it is not done) and the flow must know the message that started
    it, not take ``/start`` as the answer to its first question."""
    kv = _LosesADone("m1")
    bot, _ = five_bot()
    app = await start_app(bot, kv=kv)
    await Chat(app).say("/start")  # m1: q1 asked; its done mark lost
    assert kv.lost and texts(app.provider) == [QUESTIONS[0]]
    await app.stop()

    bot2, seen2 = five_bot()
    app2 = await start_app(bot2, kv=kv, clock=app.clock)
    app2.clock.advance(3600)  # the first worker's leases expired: recovery runs m1 again
    await app2.ops.drain()
    assert seen2.handled == ["/start"]  # the handlers had it, start_flow found it started
    assert texts(app2.provider) == []  # q1 went out already; q2 not asked
    await Chat(app2, prefix="n").say("alice")
    assert texts(app2.provider) == [QUESTIONS[1]]  # alice answered q1
    await app2.stop()
