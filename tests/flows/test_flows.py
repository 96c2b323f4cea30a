"""Conversation flows on the memory journal: ask and answer, validation, parse, max_tries,
timeouts fired by the sweeper, cancel, routing, replacement, failures, versions and
divergence, and the checkpoint's compare-and-set with the inbound's done write."""

from __future__ import annotations

from typing import Any

import pytest

from botmesh import (
    Bot,
    Context,
    Conversation,
    ErrorEvent,
    FlowCancelled,
    FlowEndedEvent,
    Inbound,
    Media,
    Outcome,
)
from botmesh.errors import (
    ConfigError,
    FlowDivergedError,
    FlowInvalidAnswer,
    FlowVersionError,
    JournalUnavailableError,
)
from botmesh.journal import MemoryKv, Write
from botmesh.testing import FaultyKv, ManualClock, SimulatedCrash, crashable
from tests.flows.kit import QUESTIONS, Chat, Seen, five_bot, signup_bot, start_app
from tests.kit import make_app, policy, texts


async def started_on_a_faulty_journal() -> tuple[Any, Chat, FaultyKv, MemoryKv]:
    """The five-question bot on a journal the test can fail or crash (``kv``, over
    ``inner``), its flow started in chat ``c``."""
    bot, _ = five_bot()
    inner = MemoryKv()
    kv = crashable(inner)
    app = await start_app(bot, kv=kv)
    chat = Chat(app)
    await chat.say("/start")
    return app, chat, kv, inner


async def test_ask_validate_parse_result_and_event() -> None:
    bot, seen = signup_bot()
    app = await start_app(bot)
    chat = Chat(app)
    for text in ["/signup", "bob", "nope", "b@x", "x", "33"]:
        assert await chat.say(text) == Outcome.HANDLED
    assert texts(app.provider) == [
        "name?",
        "email?",
        "not an email",
        "age?",
        "a number please",
        "welcome bob",
    ]
    # answers went to the flow, not to the handlers
    assert seen.handled == ["/signup"]
    [ended] = seen.ended
    assert (ended.flow, ended.chat_id, ended.status) == ("signup", "c", "done")
    assert ended.result == {"name": "bob", "email": "b@x", "age": 33}
    # keys: the first question continues the starting handler's sequence, each later send
    # is keyed from the answer that fed it
    assert [c.message.text for c in app.provider.calls] == texts(app.provider)
    out = {r.payload.get("text"): r.key for r in await app.ops.outbox.list()}
    assert out["name?"] == "m1:1"
    assert out["email?"] == "m2:1"
    assert out["not an email"] == "m3:1"
    assert out["welcome bob"] == "m6:1"
    [record] = await app.ops.flows("c")
    assert (record.status, record.steps, record.state) == ("done", 5, {"plan": "free"})
    # the chat routes to the handlers again
    await chat.say("hello")
    assert texts(app.provider)[-1] == "echo hello"
    await app.stop()


async def test_routing_other_chats_and_redelivery() -> None:
    bot, _seen = five_bot()
    app = await start_app(bot)
    chat = Chat(app)
    await chat.say("/start")
    await chat.say("hi", chat_id="other")  # another chat: its handlers
    assert texts(app.provider) == [QUESTIONS[0], "echo hi"]
    await chat.say("a1")
    # the same answer delivered again: a duplicate, nothing asked twice
    again = await app.runtime.handle(Inbound(id="m3", chat_id="c", text="a1"))
    assert again == Outcome.DUPLICATE
    assert texts(app.provider) == [QUESTIONS[0], "echo hi", QUESTIONS[1]]
    await app.stop()


async def test_timeout_fired_by_the_sweeper_without_a_message() -> None:
    bot, seen = signup_bot()
    app = await start_app(bot)
    chat = Chat(app)
    for text in ["/signup", "al", "a@b"]:
        await chat.say(text)
    app.clock.advance(599)
    await app.ops.sweep_once()
    assert texts(app.provider)[-1] == "age?"
    app.clock.advance(2)
    assert await app.ops.sweep_once() >= 1
    assert texts(app.provider)[-1] == "timed out"
    [ended] = seen.ended
    assert (ended.status, ended.result) == ("timed_out", None)
    # the timeout's send is keyed from the run and the step, not from a message
    [record] = await app.ops.flows("c")
    out = {r.payload.get("text"): r.key for r in await app.ops.outbox.list()}
    assert out["timed out"] == f"flow:{record.run}:3:1"
    # fired once: later passes do nothing
    app.clock.advance(3600)
    await app.ops.sweep_once()
    assert texts(app.provider).count("timed out") == 1
    await app.stop()


async def test_an_answer_in_time_clears_the_deadline() -> None:
    bot, seen = signup_bot()
    app = await start_app(bot)
    chat = Chat(app)
    for text in ["/signup", "al", "a@b", "40"]:
        await chat.say(text)
    app.clock.advance(3600)
    await app.ops.sweep_once()
    assert "timed out" not in texts(app.provider)
    assert [e.status for e in seen.ended] == ["done"]
    await app.stop()


def cancel_bot(catch: bool) -> tuple[Bot, Seen]:
    seen = Seen()
    bot = Bot("cancel", durability=policy())
    bot.on(FlowEndedEvent, seen.ended.append)

    @bot.flow("f", persistent=True, cancel=("/cancel", "stop"))
    async def f(conv: Conversation) -> str:
        try:
            return str(await conv.ask("first?")) + str(await conv.ask("second?"))
        except FlowCancelled:
            if not catch:
                raise
            await conv.say("bye")
            return "cancelled-politely"

    @bot.on_message
    async def handler(ctx: Context) -> None:
        seen.handled.append(ctx.text or "")
        if ctx.text == "/go":
            await ctx.start_flow(f)

    return bot, seen


@pytest.mark.parametrize("catch", [False, True])
async def test_cancel(catch: bool) -> None:
    bot, seen = cancel_bot(catch)
    app = await start_app(bot)
    chat = Chat(app)
    await chat.say("/go")
    await chat.say("one")
    await chat.say(" stop ")
    assert seen.handled == ["/go"]  # the cancel command did not reach the handlers
    [ended] = seen.ended
    assert ended.status == "cancelled"
    if catch:
        assert ended.result == "cancelled-politely"
        assert texts(app.provider) == ["first?", "second?", "bye"]
    else:
        assert isinstance(ended.error, FlowCancelled)
        assert texts(app.provider) == ["first?", "second?"]
    await chat.say("/cancel")  # no flow now: an ordinary message
    assert seen.handled == ["/go", "/cancel"]
    await app.stop()


async def test_max_tries_and_a_failing_flow() -> None:
    seen = Seen()
    bot = Bot("tries", durability=policy())
    bot.on(FlowEndedEvent, seen.ended.append)
    errors: list[Any] = []
    bot.on(ErrorEvent, errors.append)

    @bot.flow("pin")
    async def pin(conv: Conversation) -> int:
        value = await conv.ask("pin?", parse=int, invalid="digits", max_tries=2)
        if value == 0:
            raise RuntimeError("zero is not a pin")
        return int(value)

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await ctx.start_flow(pin)

    app = await start_app(bot)
    chat = Chat(app)
    await chat.say("go")
    await chat.say("x")
    await chat.say("y")
    assert texts(app.provider) == ["pin?", "digits"]  # no "digits" after the last try
    assert seen.ended[-1].status == "failed"
    assert isinstance(seen.ended[-1].error, FlowInvalidAnswer)
    await chat.say("go")
    await chat.say("0")
    assert seen.ended[-1].status == "failed"
    assert isinstance(seen.ended[-1].error, RuntimeError)
    assert any(e.where == "flow" and isinstance(e.error, RuntimeError) for e in errors)
    await chat.say("go")
    await chat.say("7")
    assert (seen.ended[-1].status, seen.ended[-1].result) == ("done", 7)
    await app.stop()


async def test_a_start_replaces_the_active_flow() -> None:
    """A handler starting a flow in a chat whose flow is active (here: parked, refused by
    new code, so its message reached the handlers) replaces it: it ends cancelled."""
    kv = MemoryKv()
    clock = ManualClock()
    app = await start_app(versioned(1), kv=kv, clock=clock)
    chat = Chat(app)
    await chat.say("/v")
    await chat.say("a")
    await app.stop()
    ended: list[FlowEndedEvent] = []
    bot2 = versioned(2)
    bot2.on(FlowEndedEvent, ended.append)
    app2 = await start_app(bot2, kv=kv, clock=clock)
    chat.app = app2
    await chat.say("/v")  # refused checkpoint: to the handlers, which start v again
    assert [(e.flow, e.status) for e in ended] == [("v", "cancelled")]
    [record] = await app2.ops.flows("c")
    assert (record.version, record.steps, record.status) == (2, 0, "active")
    assert texts(app2.provider) == ["q1"]
    await chat.say("x")
    await chat.say("y")
    assert ended[-1].result == "xy"
    await app2.stop()


async def test_non_persistent_flow_is_lost_on_restart() -> None:
    kv = MemoryKv()
    clock = ManualClock()
    bot, _seen = five_bot(persistent=False)
    app = await start_app(bot, kv=kv, clock=clock)
    chat = Chat(app)
    await chat.say("/start")
    await chat.say("a1")
    assert await app.ops.flows() == []  # it lives in memory only
    await app.stop()
    bot2, seen2 = five_bot(persistent=False)
    app2 = await start_app(bot2, kv=kv, clock=clock)
    chat2 = Chat(app2)
    chat2.n = chat.n
    await chat2.say("a2")  # no flow any more: the handlers get it
    assert seen2.handled == ["a2"]
    assert texts(app2.provider) == ["echo a2"]
    await app2.stop()


async def test_non_persistent_timeout() -> None:
    seen = Seen()
    bot = Bot("mem", durability=policy())
    bot.on(FlowEndedEvent, seen.ended.append)

    @bot.flow("t")
    async def t(conv: Conversation) -> str:
        return str(await conv.ask("soon?", timeout="1m"))

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await ctx.start_flow(t)

    app = await start_app(bot)
    await Chat(app).say("go")
    app.clock.advance(61)
    await app.ops.sweep_once()
    assert seen.ended[0].status == "timed_out"
    await app.stop()


async def test_conv_state_is_kept_between_turns() -> None:
    bot = Bot("state", durability=policy())
    draws: list[int] = []

    @bot.flow("s", persistent=True)
    async def s(conv: Conversation) -> Any:
        code = conv.state.setdefault("code", 100 + len(draws))
        draws.append(code)
        await conv.ask(f"code {code}?")
        await conv.ask("again?")
        return conv.state["code"]

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await ctx.start_flow(s)

    ended: list[FlowEndedEvent] = []
    bot.on(FlowEndedEvent, ended.append)
    app = await start_app(bot)
    chat = Chat(app)
    for text in ["go", "x", "y"]:
        await chat.say(text)
    assert ended[0].result == 100  # drawn once, kept by the checkpoint
    assert set(draws) == {100}
    await app.stop()


def versioned(version: int, on_incompatible: Any = "refuse", question: str = "q1") -> Bot:
    bot = Bot("v", durability=policy())

    @bot.flow("v", persistent=True, version=version, on_incompatible=on_incompatible)
    async def v(conv: Conversation) -> str:
        a = await conv.ask(question)
        b = await conv.ask("q2")
        return f"{a}{b}"

    @bot.on_message
    async def handler(ctx: Context) -> None:
        if ctx.text == "/v":
            await ctx.start_flow(v)
        else:
            await ctx.reply(f"handler {ctx.text}")

    return bot


@pytest.mark.parametrize("policy_name", ["refuse", "restart", "drop"])
async def test_version_mismatch(policy_name: str) -> None:
    kv = MemoryKv()
    clock = ManualClock()
    app = await start_app(versioned(1), kv=kv, clock=clock)
    chat = Chat(app)
    await chat.say("/v")
    await chat.say("a")
    await app.stop()
    errors: list[Any] = []
    ended: list[FlowEndedEvent] = []
    bot2 = versioned(2, policy_name)
    bot2.on(ErrorEvent, errors.append)
    bot2.on(FlowEndedEvent, ended.append)
    app2 = await start_app(bot2, kv=kv, clock=clock)
    chat.app = app2
    await chat.say("b")
    [err] = [e.error for e in errors]
    assert isinstance(err, FlowVersionError)
    assert "version 1" in str(err) and "version 2" in str(err) and "restart_flow" in str(err)
    [record] = await app2.ops.flows("c")
    if policy_name == "refuse":
        assert texts(app2.provider) == ["handler b"]
        assert record.status == "active" and record.version == 1
        # a timeout pass leaves a refused flow alone
        await app2.ops.sweep_once()
        # the operator restarts it under this code: the sweeper asks the first question
        await app2.ops.restart_flow("c")
        await app2.ops.sweep_once()
        assert texts(app2.provider) == ["handler b", "q1"]
        [record] = await app2.ops.flows("c")
        assert (record.version, record.steps, record.status) == (2, 0, "active")
        await app2.ops.drop_flow("c")
        assert ended[-1].status == "dropped"
        await chat.say("after")
        assert texts(app2.provider)[-1] == "handler after"
    elif policy_name == "restart":
        assert texts(app2.provider) == ["q1"]
        assert (record.version, record.steps, record.status) == (2, 0, "active")
        assert ended[0].status == "dropped"
        await chat.say("x")
        await chat.say("y")
        assert ended[-1].result == "xy"
    else:
        assert texts(app2.provider) == ["handler b"]
        assert record.status == "dropped"
        assert ended[0].status == "dropped"
    await app2.stop()


async def test_operator_restart_runs_the_first_question_again() -> None:
    app = await start_app(versioned(1))
    chat = Chat(app)
    await chat.say("/v")
    await chat.say("a")
    [before] = await app.ops.flows("c")
    await app.ops.restart_flow("c")
    await app.ops.sweep_once()
    assert texts(app.provider) == ["q1", "q2", "q1"]
    [after] = await app.ops.flows("c")
    assert after.run != before.run and after.steps == 0
    out = {r.key for r in await app.ops.outbox.list()}
    assert f"flow:{after.run}:0:1" in out
    await chat.say("x")
    await chat.say("y")
    [done] = await app.ops.flows("c")
    assert done.status == "done"
    await app.stop()


async def test_divergence_is_detected_not_mixed() -> None:
    kv = MemoryKv()
    clock = ManualClock()
    app = await start_app(versioned(1), kv=kv, clock=clock)
    chat = Chat(app)
    await chat.say("/v")
    await chat.say("a")
    await app.stop()
    errors: list[Any] = []
    bot2 = versioned(1, question="another first question")  # changed, version not bumped
    bot2.on(ErrorEvent, errors.append)
    app2 = await start_app(bot2, kv=kv, clock=clock)
    chat.app = app2
    await chat.say("b")
    [err] = [e.error for e in errors]
    assert isinstance(err, FlowDivergedError)
    assert "bump" in str(err)
    assert texts(app2.provider) == ["handler b"]  # refused: parked, to the handlers
    await app2.stop()


async def test_checkpoint_conflict_leaves_the_inbound_not_done_and_replays_it() -> None:
    """Another replica moved the flow between the turn's read and its done write: the
    commit fails as a whole; the inbound is released (not done), and its turn runs again."""
    app, chat, kv, inner = await started_on_a_faulty_journal()
    moved = False
    original = kv.commit

    async def commit(ops: Any, *, label: str = "") -> list[int]:
        nonlocal moved
        if label == Write.INBOX_MARK_DONE and len(ops) > 1 and not moved:
            moved = True  # a competing write of the checkpoint lands first
            entry = await inner.get(ops[1].key)
            assert entry is not None
            await inner.commit([type(ops[1])(entry.key, entry.value, entry.version)])
        return await original(ops, label=label)

    kv.commit = commit  # type: ignore[method-assign]
    with pytest.raises(JournalUnavailableError, match="released"):
        await chat.say("a1")
    record = await app.ops.inbox.get("m2")
    assert record is not None and record.state == "pending"
    # replayed by the sweeper: the turn runs again (on the new checkpoint version)
    await app.ops.sweep_once()
    record = await app.ops.inbox.get("m2")
    assert record is not None and record.state == "done"
    assert texts(app.provider) == QUESTIONS[:2]  # the second question went out once
    [flow] = await app.ops.flows("c")
    assert flow.steps == 1
    await app.stop()


async def test_a_failed_checkpoint_write_is_not_parked_as_done() -> None:
    app, chat, kv, _ = await started_on_a_faulty_journal()
    kv.fail(Write.INBOX_MARK_DONE)
    with pytest.raises(JournalUnavailableError):
        await chat.say("a1")
    # handled again: the turn runs again (not the "only done missing" path)
    assert await app.runtime.handle(Inbound(id="m2", chat_id="c", text="a1")) == Outcome.HANDLED
    assert texts(app.provider) == QUESTIONS[:2]
    [flow] = await app.ops.flows("c")
    assert flow.steps == 1
    await app.stop()


def test_bad_options_are_refused() -> None:
    bot = Bot("opts")
    with pytest.raises(ConfigError, match="version"):
        bot.flow("x", version=0)
    with pytest.raises(ConfigError, match="cancel"):
        bot.flow("x", cancel="/cancel")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="on_incompatible"):
        bot.flow("x", on_incompatible="ignore")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="name"):
        bot.flow("has space")


@pytest.mark.parametrize("on_diverged", ["send", "skip"])
async def test_non_persistent_crash_replays_the_answer_to_the_handlers(on_diverged: str) -> None:
    """A crash while an in-memory flow's turn ran (its answer journaled, not done): the
    flow is gone, so the replayed answer goes to the handlers as a new message; their
    reply takes the key the flow's question had (``<answer id>:1``) with other content, and
    ``outbox.on_diverged`` decides (send it under a new key, or answer from the record)."""
    inner = MemoryKv()
    clock = ManualClock()
    kv = crashable(inner)
    kv.crash_before(Write.INBOX_MARK_DONE, 2)  # the answer's turn: q2 sent, not done
    bot, _ = five_bot(persistent=False, outbox={"on_diverged": on_diverged})
    app = await start_app(bot, kv=kv, clock=clock)
    chat = Chat(app)
    await chat.say("/start")
    with pytest.raises(SimulatedCrash):
        await chat.say("a1")
    assert texts(app.provider) == QUESTIONS[:2]
    bot2, seen2 = five_bot(persistent=False, outbox={"on_diverged": on_diverged})
    app2 = await start_app(bot2, kv=inner, clock=clock)  # recovery replays m2
    assert seen2.handled == ["a1"]
    assert app2.ops.metrics()["outboxDiverged"] == 1
    assert texts(app2.provider) == (["echo a1"] if on_diverged == "send" else [])
    record = await app2.ops.inbox.get("m2")
    assert record is not None and record.state == "done"
    await app2.stop()


async def test_an_answer_with_media_replays_with_its_media() -> None:
    kv = MemoryKv()
    clock = ManualClock()

    def media_bot() -> tuple[Bot, list[FlowEndedEvent]]:
        ended: list[FlowEndedEvent] = []
        bot = Bot("media", durability=policy())
        bot.on(FlowEndedEvent, ended.append)

        @bot.flow("photo", persistent=True)
        async def photo(conv: Conversation) -> str | None:
            await conv.ask("a photo?")
            assert conv.message is not None and conv.message.media is not None
            url = conv.message.media.url
            await conv.ask("caption?")
            return url

        @bot.on_message
        async def handler(ctx: Context) -> None:
            await ctx.start_flow(photo)

        return bot, ended

    bot, _ = media_bot()
    app = await start_app(bot, kv=kv, clock=clock)
    await app.runtime.handle(Inbound(id="p1", chat_id="c", text="go"))
    pic = Media(url="https://example.org/cat.jpg", mime="image/jpeg")
    await app.runtime.handle(Inbound(id="p2", chat_id="c", media=pic))
    await app.stop()
    bot2, ended = media_bot()
    app2 = await start_app(bot2, kv=kv, clock=clock)
    await app2.runtime.handle(Inbound(id="p3", chat_id="c", text="a cat"))
    assert [(e.status, e.result) for e in ended] == [("done", "https://example.org/cat.jpg")]
    await app2.stop()


@pytest.mark.parametrize("persistent", [True, False])
async def test_app_start_flow_outside_a_handler(persistent: bool) -> None:
    bot, seen = five_bot(persistent=persistent)
    app = await start_app(bot)
    await app.runtime.start_flow("c", "five")
    assert texts(app.provider) == QUESTIONS[:1]
    if persistent:
        [record] = await app.ops.flows("c")
        out = {r.key for r in await app.ops.outbox.list()}
        assert f"flow:{record.run}:0:1" in out
    chat = Chat(app)
    for answer in ["a1", "a2", "a3", "a4", "a5"]:
        await chat.say(answer)
    assert [(e.status, e.result) for e in seen.ended] == [("done", ["a1", "a2", "a3", "a4", "a5"])]
    assert seen.handled == []
    await app.stop()


async def test_app_start_flow_after_a_crash_is_finished_by_the_sweeper() -> None:
    inner = MemoryKv()
    clock = ManualClock()
    kv = crashable(inner)
    kv.crash_before(Write.OUTBOX_MARK_SENT)  # the first question went out, not recorded
    bot, _ = five_bot(outbox={"on_ambiguous": "skip"})
    app = await start_app(bot, kv=kv, clock=clock)
    with pytest.raises(SimulatedCrash):
        await app.runtime.start_flow("c", "five")
    bot2, _ = five_bot(outbox={"on_ambiguous": "skip"})
    app2 = await start_app(bot2, kv=inner, clock=clock)  # recovery runs the start
    [record] = await app2.ops.flows("c")
    assert (record.status, record.steps) == ("active", 0)
    # the question was in flight at the crash: unknown under skip, not asked twice
    assert texts(app2.provider) == []
    await Chat(app2).say("a1")
    assert texts(app2.provider) == [QUESTIONS[1]]
    await app2.stop()


async def test_a_state_that_is_not_json_fails_the_flow() -> None:
    seen = Seen()
    bot = Bot("badstate", durability=policy())
    bot.on(FlowEndedEvent, seen.ended.append)

    @bot.flow("s", persistent=True)
    async def s(conv: Conversation) -> None:
        conv.state["when"] = object()
        await conv.ask("q?")

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await ctx.start_flow(s)

    app = await start_app(bot)
    assert await Chat(app).say("go") == Outcome.HANDLED
    [ended] = seen.ended
    assert ended.status == "failed" and "conv.state must stay a JSON object" in str(ended.error)
    await app.stop()


async def test_a_persistent_flow_goes_on_on_whichever_replica_gets_the_answer() -> None:
    """Two runtimes (two replicas, other instance ids) on one journal: the answers of one
    chat land on either; the flow goes on from the checkpoint, each question once."""
    kv = MemoryKv()
    clock = ManualClock()
    bot_a, seen_a = five_bot()
    bot_b, seen_b = five_bot()
    a = await make_app(kv=kv, clock=clock, bot=bot_a, instance_id="replica-a")
    b = await make_app(kv=kv, clock=clock, bot=bot_b, instance_id="replica-b")
    chats = [Chat(a), Chat(b)]
    for i, text in enumerate(["/start", "a1", "a2", "a3", "a4", "a5"]):
        chat = chats[i % 2]
        chat.n = i
        assert await chat.say(text) == Outcome.HANDLED
    sent = texts(a.provider) + texts(b.provider)
    assert sorted(t or "" for t in sent) == sorted([*QUESTIONS, "thanks a1,a2,a3,a4,a5"])
    assert [e.result for e in seen_a.ended + seen_b.ended] == [["a1", "a2", "a3", "a4", "a5"]]
    await a.stop()
    await b.stop()


async def test_a_flow_turn_taken_over_by_another_holder_is_fenced() -> None:
    app, chat, kv, inner = await started_on_a_faulty_journal()
    original = kv.commit
    taken = False

    async def commit(ops: Any, *, label: str = "") -> list[int]:
        nonlocal taken
        if label == Write.INBOX_MARK_DONE and len(ops) > 1 and not taken:
            taken = True  # another instance claimed the inbound (a new fencing token)
            entry = await inner.get(ops[0].key)
            assert entry is not None
            value = {**entry.value, "token": entry.value["token"] + 1}
            await inner.commit([type(ops[0])(entry.key, value, entry.version)])
        return await original(ops, label=label)

    kv.commit = commit  # type: ignore[method-assign]
    assert await chat.say("a1") == Outcome.FENCED
    assert app.ops.metrics()["staleLeases"] == 1
    [flow] = await app.ops.flows("c")
    assert flow.steps == 0  # nothing of the fenced turn landed: the new holder's turn will
    await app.stop()
