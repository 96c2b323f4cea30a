"""An operator's replay of an old message is never a flow's answer (defect 4 of the audit).

docs/flows.md (Routing) promises that a message handled already and run again goes where it
went the first time: to the flow when it is one of the flow's recorded steps, else to the
handlers; "it is never taken as a new answer to the pending question". An operator's
``replay_inbound`` of a message older than the chat's flow used to be fed to the flow as
the answer to its pending ask (the next question went out, the real answer was lost).
"""

from __future__ import annotations

import pytest

from botmesh.journal import MemoryKv
from tests.flows.kit import QUESTIONS, Chat, five_bot, start_app
from tests.kit import texts


@pytest.mark.parametrize("persistent", [True, False])
async def test_a_replayed_old_message_goes_to_the_handlers_not_to_the_flow(
    persistent: bool,
) -> None:
    bot, seen = five_bot(persistent=persistent)
    app = await start_app(bot)
    chat = Chat(app)
    await chat.say("hello")  # m1: before the flow, the handlers echo it
    await chat.say("/start")  # m2: the flow asks q1
    assert texts(app.provider) == ["echo hello", QUESTIONS[0]]

    await app.ops.replay_inbound("m1")
    await app.ops.drain()
    # the handlers had it the first time, so they have it again (their echo is answered
    # from the outbox); the flow still waits for its first answer
    assert seen.handled == ["hello", "/start", "hello"]
    assert texts(app.provider) == ["echo hello", QUESTIONS[0]]

    await chat.say("alice")  # m3: the real answer to q1
    assert texts(app.provider) == ["echo hello", QUESTIONS[0], QUESTIONS[1]]
    for answer in ("a@x", "30", "paris", "blue"):
        await chat.say(answer)
    assert seen.ended and seen.ended[0].result == ["alice", "a@x", "30", "paris", "blue"]
    await app.stop()


async def test_a_replayed_answer_stays_the_step_it_was() -> None:
    bot, seen = five_bot()
    app = await start_app(bot)
    chat = Chat(app)
    await chat.say("/start")  # m1
    await chat.say("alice")  # m2: the answer to q1; q2 asked
    await app.ops.replay_inbound("m2")
    await app.ops.drain()
    assert texts(app.provider) == QUESTIONS[:2]  # nothing asked again, nothing skipped
    assert seen.handled == ["/start"]
    await chat.say("a@x")  # m3: the answer to q2
    assert texts(app.provider) == QUESTIONS[:3]
    await app.stop()


async def test_a_replay_interrupted_by_a_crash_is_still_not_an_answer() -> None:
    """The mark is on the journal record: a replay run again after a crash keeps it."""
    kv = MemoryKv()
    bot, _ = five_bot()
    app = await start_app(bot, kv=kv)
    chat = Chat(app)
    await chat.say("hello")
    await chat.say("/start")
    await app.ops.replay_inbound("m1")  # pending again; this process stops before it ran
    await app.stop()

    bot2, seen2 = five_bot()
    app2 = await start_app(bot2, kv=kv, clock=app.clock)  # recovery runs the replay
    await app2.ops.drain()
    assert seen2.handled == ["hello"]
    await Chat(app2, prefix="n").say("alice")
    assert texts(app2.provider) == [QUESTIONS[1]]  # alice answered q1; q2 asked
    await app2.stop()
