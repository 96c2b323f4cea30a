"""The inbox: journal before handlers, done after, replay, dedupe, fail closed/open."""

from __future__ import annotations

from botmesh import Bot, Inbound, JournalUnavailableError, MemoryDurability, MockProvider
from botmesh.testing import ManualClock
from state.kv import Put
from tests.core.helpers import FlakyKv, durable, make_bot


async def test_inbound_is_journaled_before_any_handler_and_done_after() -> None:
    bot, _, _, d = make_bot()
    seen: list[tuple[str, str | None]] = []

    @bot.on_message
    async def handler(ctx):  # type: ignore[no-untyped-def]
        rec = await d.inbox.get(ctx.message.id)
        assert rec is not None
        seen.append((rec.state, rec.lease_owner))

    await bot.start()
    await bot.handle(Inbound("m1", "c", "hi"))
    assert seen == [("pending", d.instance_id)]
    rec = await d.inbox.get("m1")
    assert rec is not None and rec.state == "done" and rec.lease_owner is None
    assert rec.inbound() == Inbound("m1", "c", "hi")
    assert d.metrics()["inboundJournaled"] == 1


async def test_done_only_once_effects_settled() -> None:
    bot, provider, _, d = make_bot()
    states: list[str] = []

    @bot.on_message
    async def handler(ctx):  # type: ignore[no-untyped-def]
        await ctx.reply("one")
        rec = await d.inbox.get("m1")
        assert rec is not None
        states.append(rec.state)  # still pending while the handler runs

    await bot.start()
    await bot.handle(Inbound("m1", "c"))
    assert states == ["pending"]
    assert [m.text for m in provider.sent] == ["one"]


async def test_redelivery_is_recognised_while_the_record_exists() -> None:
    bot, provider, clock, d = make_bot(retention="1h")
    runs: list[str] = []

    @bot.on_message
    async def handler(ctx):  # type: ignore[no-untyped-def]
        runs.append(ctx.message.id)
        await ctx.reply("hello")

    await bot.start()
    await bot.handle(Inbound("m1", "c"))
    await bot.handle(Inbound("m1", "c"))
    assert runs == ["m1"] and d.metrics()["inboundDuplicates"] == 1
    clock.advance(3601)
    assert await d.sweep_once() == 2  # inbox and outbox records purged
    await bot.handle(Inbound("m1", "c"))  # the record is gone: processed again
    assert runs == ["m1", "m1"] and len(provider.sent) == 2


async def test_concurrent_duplicates_run_once() -> None:
    import asyncio

    bot, _, _, d = make_bot()
    gate = asyncio.Event()
    runs = 0

    @bot.on_message
    async def handler(ctx):  # type: ignore[no-untyped-def]
        nonlocal runs
        runs += 1
        await gate.wait()

    await bot.start()
    first = asyncio.create_task(bot.handle(Inbound("m1", "c")))
    await asyncio.sleep(0)
    await bot.handle(Inbound("m1", "c"))
    gate.set()
    await first
    assert runs == 1 and d.metrics()["inboundDuplicates"] == 1


async def test_handler_that_raises_is_not_retried_and_acknowledged() -> None:
    bot, _, clock, d = make_bot()
    errors: list[BaseException] = []
    bot.on("error", errors.append)
    runs = 0

    @bot.on_message
    async def handler(ctx):  # type: ignore[no-untyped-def]
        nonlocal runs
        runs += 1
        raise RuntimeError("boom")

    await bot.start()
    await bot.handle(Inbound("m1", "c"))
    clock.advance(3600)
    await d.drain()
    rec = await d.inbox.get("m1")
    assert rec is not None and rec.state == "done"
    assert runs == 1 and [str(e) for e in errors] == ["boom"]


async def test_unfinished_records_are_replayed_on_start() -> None:
    shared = MemoryDurability()
    clock = ManualClock()
    kv = shared.kv
    # an earlier incarnation journaled m1 and died before it was done
    from state import inbox as inbox_sm
    from state.keys import scope_id

    scope = scope_id("default", "default", "bot", "default")
    value = inbox_sm.new_value(
        Inbound("m1", "c", "hi"), clock.now(), owner="i1", boot="old", lease=60, media_refs=True
    )
    await kv.commit([Put(f"{scope}/in/m1", value, expect=0, due=clock.now() + 60)])
    provider = MockProvider()
    bot = Bot(provider, durability={"backend": shared, "instance_id": "i1", "poll": 0}, clock=clock)

    @bot.on_message
    async def handler(ctx):  # type: ignore[no-untyped-def]
        await ctx.reply(f"re: {ctx.text}")

    await bot.start()  # same instance id: reclaimed at once, without waiting for the lease
    d = durable(bot.durability)
    assert [m.text for m in provider.sent] == ["re: hi"]
    rec = await d.inbox.get("m1")
    assert rec is not None and (rec.state, rec.attempts, rec.token) == ("done", 2, 2)
    assert d.metrics()["inboundReplayed"] == 1


async def test_a_message_that_crashes_every_run_is_dead_after_max_attempts() -> None:
    from botmesh.testing import SimulatedCrash, crashable

    shared = MemoryDurability()
    clock = ManualClock()
    dead: list[object] = []
    runs = 0
    for _ in range(3):
        a = crashable(shared)
        bot = Bot(
            MockProvider(),
            durability={"backend": a, "instance_id": "i1", "poll": 0, "inbox": {"max_attempts": 3}},
            clock=clock,
        )

        @bot.on_message
        async def handler(ctx):  # type: ignore[no-untyped-def]
            nonlocal runs
            runs += 1
            raise SimulatedCrash("during", "handler", 0)  # the process dies in the handler

        try:
            await bot.start()
            await bot.handle(Inbound("poison", "c"))
        except SimulatedCrash:
            pass
    bot = Bot(
        MockProvider(),
        durability={
            "backend": shared,
            "instance_id": "i1",
            "poll": 0,
            "inbox": {"max_attempts": 3},
        },
        clock=clock,
    )
    bot.on("durability:dead", dead.append)
    await bot.start()
    d = durable(bot.durability)
    assert runs == 3  # three runs charged, then the next start dead-letters it
    [rec] = await d.inbox.list(state="dead")
    assert rec.id == "poison" and rec.error is not None and "3 runs" in rec.error["message"]
    assert d.metrics()["inboundDead"] == 1 and len(dead) == 1


async def test_failures_before_the_handlers_back_off_then_dead() -> None:
    bot, _, clock, d = make_bot(inbox={"max_attempts": 3, "backoff": {"base": "10s", "jitter": 0}})
    await bot.start()
    # a journaled record whose message cannot be rebuilt (written by something else)
    await d.kv.commit(
        [
            Put(
                d.in_prefix + "bad",
                {
                    "t": "in",
                    "id": "bad",
                    "state": "pending",
                    "attempts": 0,
                    "token": 0,
                    "lease": None,
                    "message": {"kind": "carrier-pigeon"},
                    "error": None,
                },
                expect=0,
                due=clock.now(),
            )
        ]
    )
    assert await d.sweep_once() == 1
    rec = await d.inbox.get("bad")
    assert rec is not None and (rec.state, rec.attempts) == ("pending", 1)
    entry = await d.kv.get(d.in_prefix + "bad")
    assert entry is not None and entry.due == clock.now() + 10  # inbox backoff, attempt 1
    assert await d.sweep_once() == 0  # not due yet
    clock.advance(10)
    assert await d.sweep_once() == 1
    entry = await d.kv.get(d.in_prefix + "bad")
    assert entry is not None and entry.due == clock.now() + 20  # doubled
    clock.advance(20)
    await d.sweep_once()
    rec = await d.inbox.get("bad")
    assert rec is not None and rec.state == "dead" and rec.attempts == 3
    assert d.metrics()["inboundDead"] == 1


async def test_claim_failing_on_a_down_journal_backs_off_in_memory() -> None:
    flaky = FlakyKv()
    bot, _, clock, d = make_bot(backend=flaky, inbox={"backoff": {"base": "5s", "jitter": 0}})
    await bot.start()
    await d.kv.commit(
        [
            Put(
                d.in_prefix + "m",
                {
                    "t": "in",
                    "id": "m",
                    "state": "pending",
                    "attempts": 0,
                    "token": 0,
                    "lease": None,
                    "message": {"id": "m", "chat_id": "c"},
                },
                expect=0,
                due=clock.now(),
            )
        ]
    )
    flaky.fail("inbox.claim", 1)
    errors: list[BaseException] = []
    bot.on("error", errors.append)
    assert await d.sweep_once() == 0 and len(errors) == 1
    assert await d.sweep_once() == 0  # backing off: not even tried
    assert flaky.fail_labels["inbox.claim"] == 0
    clock.advance(5)
    assert await d.sweep_once() == 1
    rec = await d.inbox.get("m")
    assert rec is not None and rec.state == "done"


async def test_fail_closed_by_default() -> None:
    flaky = FlakyKv()
    bot, _, _, d = make_bot(backend=flaky)
    errors: list[BaseException] = []
    bot.on("error", errors.append)
    runs = 0

    @bot.on_message
    async def handler(ctx):  # type: ignore[no-untyped-def]
        nonlocal runs
        runs += 1

    await bot.start()
    flaky.fail("inbox.journal")
    await bot.handle(Inbound("m1", "c"))
    assert runs == 0 and isinstance(errors[0], JournalUnavailableError)
    await bot.handle(Inbound("m1", "c"))  # the in-memory dedupe forgot it: redelivery runs
    assert runs == 1 and d.metrics()["inboundDuplicates"] == 0


async def test_fail_open_dispatches_without_the_journal() -> None:
    flaky = FlakyKv()
    bot, provider, _, d = make_bot(backend=flaky, fail_open=True)
    errors: list[BaseException] = []
    bot.on("error", errors.append)

    @bot.on_message
    async def handler(ctx):  # type: ignore[no-untyped-def]
        await ctx.reply("still here")

    await bot.start()
    flaky.down = True
    await bot.handle(Inbound("m1", "c"))
    assert [m.text for m in provider.sent] == ["still here"]
    assert len(errors) == 1 and d.metrics()["outboxBypassed"] == 1


async def test_a_journal_failure_after_the_handlers_never_reaches_the_caller() -> None:
    flaky = FlakyKv()
    bot, provider, clock, d = make_bot(backend=flaky)
    errors: list[BaseException] = []
    bot.on("error", errors.append)

    @bot.on_message
    async def handler(ctx):  # type: ignore[no-untyped-def]
        await ctx.reply("hi")

    await bot.start()
    flaky.fail("inbox.mark_done")
    await bot.handle(Inbound("m1", "c"))  # does not raise into the worker
    assert isinstance(errors[0], JournalUnavailableError)
    rec = await d.inbox.get("m1")
    assert rec is not None and rec.state == "pending"
    clock.advance(61)
    await d.drain()  # the lease ran out: handled again, its reply answered from the outbox
    rec = await d.inbox.get("m1")
    assert rec is not None and rec.state == "done" and len(provider.sent) == 1
