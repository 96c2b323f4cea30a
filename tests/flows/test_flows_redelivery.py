"""A done message delivered again from where it was read (a Kafka offset replay after a
worker was killed) while its chat's flow waits: it runs as it ran the first time (the
handlers get it again, or the flow finds it among its steps), it is not taken as the answer
to the pending question."""

from __future__ import annotations

from collections import Counter

from botmesh import Inbound, Outcome
from botmesh.testing import MockProvider
from tests.flows.kit import QUESTIONS, five_bot, start_app


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
